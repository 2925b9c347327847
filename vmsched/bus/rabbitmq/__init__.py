"""The bus on RabbitMQ, through kombu's and py-amqp's public APIs.

:mod:`broker` is the transport (and makes one blocking request); :mod:`connection` opens connections and knows
the errors that mean the broker went away; :mod:`worker` consumes a service's request queues, :mod:`client` sends
the gateway's requests and reads their replies, :mod:`events` publishes events; :mod:`poison` and :mod:`journal`
decide what happens to a redelivered request.
"""

"""Connects to the broker port on 127.0.0.1:5672."""
import socket


class P:
    def do_filter(self, hosts, vm, args):
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
        return hosts

"""What a change of policy would have done: recordings of the engine's calls, and their replay.

- :mod:`.format`: the recording's records (versioned JSON lines), written and read back;
- :mod:`.writer`: :class:`~.writer.RecordWriter`, off the request path, bounded, gzip members;
- :mod:`.reader`: recording files read back and joined by call ID into :class:`~.reader.RecordedCall`;
- :mod:`.compare`: the engine's decision from units' outcomes (:mod:`vmsched.decide.rules`), two compared, and
  the per-host, per-unit explanation;
- :mod:`.replay`: a candidate (a plugins folder in a sandboxed pool, changed units and factors) run on calls;
- :mod:`.report`: the replay's figures, as JSON; :mod:`.html`: the offline HTML report.

docs/testing-policies.md is the user's guide. Standard library, pydantic and the rest of the vmsched library
only: no app (gateway, services, CLI).
"""

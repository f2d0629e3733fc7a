"""The demos behind ``langgraph-deterministic demo`` (``support_agent``: a support agent's
worker killed mid-refund, on PostgresSaver and on DeterministicSaver) and ``demo
--restate`` (``parallel_restate``: parallel nodes replayed on restate-server, with
``_restate_local`` to find, start and stop one). Not part of the API: the CLI is their
interface. Their Postgres is ``langgraph_deterministic.embedded``'s."""

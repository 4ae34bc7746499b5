"""Free localhost ports for the tests' `jax.distributed` jobs."""
import socket


def coordinator_port() -> int:
  """A port p such that p and p + 1 are both free now: a job's coordinator listens on p and its
  side channel (`train.multihost.rendezvous.side_address`) on p + 1."""
  for _ in range(100):
    with socket.socket() as a:
      a.bind(("127.0.0.1", 0))
      port = a.getsockname()[1]
      if port >= 65535:
        continue
      with socket.socket() as b:
        try:
          b.bind(("127.0.0.1", port + 1))
        except OSError:
          continue
        return port
  raise RuntimeError("no two consecutive free ports on localhost")

"""The job's side channel (no JAX: "processes" are threads of this test on localhost sockets).
Issue 44: a process with another --learning_rate trained its own copy without a word, and a
process missing at start-up or a lost process 0 ended the others with a C++ check failure."""
import socket
import threading
import time

import pytest

from jaxrl_sys.train.multihost.rendezvous import JoinError, Rendezvous
from tests.ports import coordinator_port

SETTINGS = {"optim.learning_rate": 0.001, "loop.seed": 0, "resume": False}


def _port() -> int:
  return coordinator_port()  # p and p + 1 (the side channel) free


def _job(settings, timeout=5.0):
  """Joins len(settings) processes at once; returns ({index: Rendezvous}, {index: error})."""
  address = f"127.0.0.1:{_port()}"
  made, errors = {}, {}

  def one(i):
    made[i] = Rendezvous(address, i, len(settings), settings[i], timeout=timeout)
    try:
      made[i].join()
    except (ValueError, JoinError) as e:
      errors[i] = e

  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(settings))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  return made, errors


def test_different_settings_stop_every_process_naming_them():
  made, errors = _job([SETTINGS, dict(SETTINGS, **{"optim.learning_rate": 0.5, "loop.seed": 7})])
  assert set(errors) == {0, 1}
  for e in errors.values():
    assert isinstance(e, ValueError)
    assert str(e).endswith("process 1 differs from process 0 in loop.seed 7 vs 0, "
                           "optim.learning_rate 0.5 vs 0.001")
  for r in made.values():
    r.close()


def test_a_missing_process_or_coordinator_is_named_within_the_timeout():
  address = f"127.0.0.1:{_port()}"
  with pytest.raises(JoinError, match=r"process 1 of 2 did not join within "
                                      r"distributed.timeout=0.5 s"):
    Rendezvous(address, 0, 2, SETTINGS, timeout=0.5).join()
  with pytest.raises(JoinError, match=r"process 0 \(the coordinator\) at 127.0.0.1:\d+ did not "
                                      r"answer within distributed.timeout=0.5 s"):
    Rendezvous(address, 1, 2, SETTINGS, timeout=0.5).join()


def _watching(made):
  said = {i: [] for i in made}
  for i, r in made.items():
    r.watch(said[i].append)
  return said


def _until(pred, timeout=10.0):
  end = time.monotonic() + timeout
  while not pred() and time.monotonic() < end:
    time.sleep(0.01)
  return pred()


def test_a_lost_process_is_named_at_once_by_every_other_and_an_ended_one_is_not():
  made, errors = _job([SETTINGS] * 3)
  assert not errors
  said = _watching(made)
  made[1].finish()  # ends cleanly: not a loss
  made[1].close()
  made[2]._ended.set()  # process 2 dies: its socket closes, nothing said
  for sock, _ in made[2]._peers.values():  # as the kernel does for a dead process
    sock.shutdown(socket.SHUT_RDWR)
  assert _until(lambda: said[0] and said[2] == [] and said[1] == [] and len(said[0]) == 1)
  assert said[0][0].startswith("lost process 2 of 3: its connection closed")
  made[0].close()


def test_losing_the_coordinator_is_one_line_on_the_others():
  made, errors = _job([SETTINGS] * 2)
  assert not errors
  said = _watching(made)
  made[0]._ended.set()  # process 0 dies without a word
  for sock, _ in made[0]._peers.values():
    sock.shutdown(socket.SHUT_RDWR)
  assert _until(lambda: said[1])
  assert said[1] == ["lost process 0 of 2 (the coordinator): its connection closed (killed, "
                     "crashed, or its host went down). Process 1 stops too; resume the run with "
                     "--resume from its last checkpoint, if it saved one (--save_every)"]
  made[1].close()

"""Runs the Python snippets of docs/losses.md, in order, in one namespace."""
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "losses.md"


def test_losses_doc_snippets_run():
  blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
  assert len(blocks) >= 3 and "from jaxrl_sys.losses import" in blocks[0]
  assert "grpo_loss" in blocks[0]
  namespace = {"__name__": "losses_doc"}
  for block in blocks:
    exec(compile(block, str(DOC), "exec"), namespace)  # pylint: disable=exec-used
  assert namespace["metrics"]["num_sequences"] == 8
  assert abs(float(namespace["metrics"]["ess"]) - 8.0) < 1e-4

"""Bad input is rejected early with a message that names the problem."""
import pytest

from jaxrl_sys.train import recipe as recipe_lib
from jaxrl_sys.train.loop.config import LoopConfig
from tests.train.common import quick


@pytest.mark.parametrize("kw,message", [
    (dict(mesh="8x"), "bad mesh string '8x'"),
    (dict(algo="reinforce"), "unknown train.algo 'reinforce'"),
    (dict(group_size=1), "loop.group_size=1 with train.algo=grpo"),
    (dict(max_prompt_len=3), "prompt longer than the context"),
    (dict(model="no/such/dir"), "unknown model"),
    (dict(task="chess"), "unknown task 'chess'"),
    (dict(mode="sometimes"), "unknown loop.mode 'sometimes'"),
    (dict(mode="sync", max_staleness=2), "needs loop.mode='async'"),
])
def test_build_recipe_errors(kw, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
    recipe_lib.build_recipe(quick(**kw))


def test_mesh_larger_than_devices():
  recipe = recipe_lib.build_recipe(quick(mesh="4x4"))
  with pytest.raises(ValueError, match=r"needs 16 devices but only \d+ are present"):
    recipe_lib.recipe_mesh(recipe.mesh_spec)


def test_prompt_longer_than_model_context():
  from jaxrl_sys.train.loop.config import check_lengths
  from jaxrl_sys.train.recipe.presets import load_model
  model = load_model("tiny", max_seq_len=10)
  with pytest.raises(ValueError, match="prompt longer than the context"):
    check_lengths(model.config.max_seq_len, LoopConfig(max_prompt_len=8, max_new_tokens=4))

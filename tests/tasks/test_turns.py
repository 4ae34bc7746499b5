"""Turn formats: glue derived from chat templates, the append-only self-check, demonstrations."""
import pytest

from jaxrl_sys.models import HFTokenizer
from jaxrl_sys.tasks import CalculatorTask, CharTokenizer
from jaxrl_sys.tasks.turns import (SAMPLE_CONVERSATION, ChatTemplateFormat, PlainFormat,
                                   TemplateMismatchError, demonstration_ids, first_difference)
from tests.tasks.chat_fixtures import (DROPS_NEWLINE_TEMPLATE, QWEN25_TEMPLATE, QWEN3_TEMPLATE,
                                       make_tokenizer_dir)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("tok")
  return {name: HFTokenizer(make_tokenizer_dir(str(root / name), t)) for name, t in
          [("qwen25", QWEN25_TEMPLATE), ("qwen3", QWEN3_TEMPLATE),
           ("drops_newline", DROPS_NEWLINE_TEMPLATE)]}


@pytest.mark.parametrize("name", ["qwen25", "qwen3"])
def test_self_check_passes_on_qwen_style_templates(tokenizers, name):
  tok = tokenizers[name]
  fmt = ChatTemplateFormat(tok)
  fmt.check()
  im_end = tok.encode("<|im_end|>")
  assert fmt.stop_ids[0] == im_end[0] and fmt.glue_ids == tok.encode("\n")
  # An episode's pieces, by hand: the prompt render, the turn's ids, <|im_end|>\n, then the
  # tool turn up to the next generation prompt.
  ids = fmt.observation(["84"])
  assert tok.decode(ids, stop_at_eos=False, skip_special_tokens=False) == (
      "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n")
  two = tok.decode(fmt.observation(["1", "2"]), stop_at_eos=False, skip_special_tokens=False)
  assert "1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>" in two
  assert fmt.close_turn(tok.encode("hi") + im_end) == fmt.glue_ids
  assert fmt.close_turn(tok.encode("hi")) == im_end + fmt.glue_ids  # budget ran out


def test_self_check_names_the_first_differing_token(tokenizers):
  tok = tokenizers["drops_newline"]
  fmt = ChatTemplateFormat(tok)
  # Independently: the full render against the same conversation with every "<|im_end|>" of
  # an assistant turn followed by "\n" (what episodes append), token by token.
  conv = list(SAMPLE_CONVERSATION)
  full = tok.encode(tok.apply_chat_template(conv, add_generation_prompt=False))
  text = tok.apply_chat_template(conv, add_generation_prompt=False)
  expected = first_difference(full, tok.encode(text.replace(
      "</tool_call><|im_end|><|im_start|>", "</tool_call><|im_end|>\n<|im_start|>")))
  assert expected is not None
  with pytest.raises(TemplateMismatchError) as e:
    fmt.check()
  shown = tok.decode([full[expected]], stop_at_eos=False, skip_special_tokens=False)
  assert f"differ at token {expected}: id {full[expected]} {shown!r}" in str(e.value)


def test_plain_format_and_demonstrations():
  task = CalculatorTask(num_ops=2, digits=2)
  tok = CharTokenizer(task.alphabet)
  fmt = PlainFormat(tok)
  ids, mask = demonstration_ids(fmt, task.demonstration(0))
  p = task.problem(0)
  calls = p.meta["calls"]
  want = tok.encode(p.prompt, bos=True)
  want_mask = [0] * len(want)
  for call, result in zip(calls, [task.demonstration(0)[2][0], task.demonstration(0)[4][0]]):
    turn = tok.encode(f"<<calc {call}>>", eos=True)
    obs = tok.encode(f"\n{result}\n")
    want += turn + obs
    want_mask += [1] * len(turn) + [0] * len(obs)
  want += tok.encode(p.answer, eos=True)
  want_mask += [1] * (len(p.answer) + 1)
  assert ids == want and mask == want_mask
  # characters outside a character alphabet become "?" in observations
  assert tok.decode(fmt.observation(["error: 1+x"])) == "\n?????? 1+?\n"

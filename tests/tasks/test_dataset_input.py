"""Data a user brings (issue 44): a byte-order mark is skipped, a key given twice is an error, and
characters the model's tokenizer does not know are counted and named."""
import json

import pytest

from jaxrl_sys.tasks import CharTokenizer, DatasetTask, read_rows
from jaxrl_sys.tasks.dataset import unknown_characters_note

ROWS = [{"prompt": "3*4=", "answer": "12"}, {"prompt": "what is 3*4?", "answer": "12"},
        {"prompt": "1+1=", "answer": "2"}]


def _write(path, text: str, encoding="utf-8"):
  path.write_bytes(text.encode(encoding))
  return str(path)


def test_utf8_bom_is_skipped_in_jsonl_and_json_arrays(tmp_path):
  lines = "\n".join(json.dumps(r) for r in ROWS) + "\n"
  assert read_rows(_write(tmp_path / "a.jsonl", "\ufeff" + lines)) == ROWS
  assert read_rows(_write(tmp_path / "b.jsonl", lines, "utf-8-sig")) == ROWS
  assert read_rows(_write(tmp_path / "c.json", "\ufeff" + json.dumps(ROWS))) == ROWS


def test_a_key_given_twice_is_named_with_its_line(tmp_path):
  path = _write(tmp_path / "d.jsonl", json.dumps(ROWS[0]) + "\n"
                '{"prompt": "8+2=", "prompt": "", "answer": "10"}\n')
  with pytest.raises(ValueError, match=r"d\.jsonl line 2: the key 'prompt' appears twice"):
    read_rows(path)
  nested = _write(tmp_path / "e.json", '[{"prompt": "1=", "meta": {"a": 1, "a": 2}}]')
  with pytest.raises(ValueError, match=r"e\.json: the key 'a' appears twice"):
    read_rows(nested)


def test_unknown_characters_are_counted_and_named():
  task = DatasetTask(ROWS)
  tok = CharTokenizer("0123456789+-*/=():, ")  # the tiny Hugging Face model's alphabet
  note = unknown_characters_note(task, tok)
  assert note.startswith("1 of 3 rows hold characters the model's tokenizer does not know: "
                         "'?ahistw'")
  assert "row 1: 'what is 3*4?'" in note
  assert unknown_characters_note(task, CharTokenizer()) is None  # the default alphabet has them
  assert tok.unknown_characters("what is 3*4?") == "whatis?"


def test_hf_tokenizer_names_the_text_it_maps_to_its_unknown_token(tmp_path):
  from jaxrl_sys.models import HFTokenizer  # pylint: disable=import-outside-toplevel
  for name, text in CharTokenizer("0123456789+-*/=():, ").hf_tokenizer_files().items():
    (tmp_path / name).write_text(text)
  tok = HFTokenizer(str(tmp_path))
  assert tok.unk_token == "<pad>"
  assert tok.unknown_characters("what is 3*4?") == "whatis?"
  assert tok.unknown_characters("3*4=") == ""

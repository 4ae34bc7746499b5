"""Tokenizers built locally (byte-level BPE trained here, no hub) with Qwen-style chat templates.

`QWEN25_TEMPLATE` and `QWEN3_TEMPLATE` follow the structure of the Qwen2.5 / Qwen3 templates
(ChatML turns; a tools block in the system turn; consecutive tool results grouped in one user
turn inside `<tool_response>` tags; Qwen3: `<think>` blocks kept after the last user query and
an empty one in the generation prompt when thinking is off). `DROPS_NEWLINE_TEMPLATE` is
deliberately not append-only: it drops the newline after `<|im_end|>` when a tool result
follows an assistant turn (the verl#6921 class of bug).
"""
import json
import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
         "</think>"]

_CHATML_TURNS = """
{%- for message in messages %}
  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
  {%- elif message.role == 'assistant' %}
    {{- '<|im_start|>assistant' }}{{ ASSISTANT_BODY }}{{- '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' %}
    {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}
      {{- '<|im_start|>user' }}
    {%- endif %}
    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
      {{- '<|im_end|>\\n' }}
    {%- endif %}
  {%- endif %}
{%- endfor %}
"""

_SYSTEM = """
{%- if tools %}
  {{- '<|im_start|>system\\n' }}
  {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
  {{- '# Tools\\n\\n<tools>' }}
  {%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
  {{- '\\n</tools>\\n\\nFor each call return <tool_call>{"name": ..., "arguments": ...}'
      '</tool_call>.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
  {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
"""

_QWEN25_BODY = """
    {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
    {%- for call in message.tool_calls or [] %}
      {{- '\\n<tool_call>\\n{"name": "' + call.function.name + '", "arguments": '
          + (call.function.arguments | tojson) + '}\\n</tool_call>' }}
    {%- endfor %}
"""

QWEN25_TEMPLATE = (_SYSTEM + _CHATML_TURNS.replace("{{ ASSISTANT_BODY }}", _QWEN25_BODY)
                   + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                   "{%- endif %}")

_QWEN3_HEAD = """
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for m in messages[::-1] %}
  {%- set index = (messages|length - 1) - loop.index0 %}
  {%- if m.role == 'user' and ns.last_query_index == messages|length - 1 %}
    {%- set ns.last_query_index = index %}
  {%- endif %}
{%- endfor %}
"""

_QWEN3_BODY = """
    {%- set content = message.content %}
    {%- set reasoning = '' %}
    {%- if '</think>' in content %}
      {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]
          .lstrip('\\n') %}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
      {{- '\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
    {%- else %}
      {{- '\\n' + content }}
    {%- endif %}
"""

QWEN3_TEMPLATE = (_QWEN3_HEAD + _SYSTEM.replace(
    "{%- else %}\n  {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n", "")
    + _CHATML_TURNS.replace("{{ ASSISTANT_BODY }}", _QWEN3_BODY)
    + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")

# Not append-only: `<|im_end|>` is followed by a newline except before a tool result.
DROPS_NEWLINE_TEMPLATE = QWEN25_TEMPLATE.replace(
    "{{- '<|im_end|>\\n' }}\n  {%- elif message.role == 'tool' %}",
    "{{- '<|im_end|>' }}{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '\\n' }}{%- endif %}\n  {%- elif message.role == 'tool' %}")

_CORPUS = ("What is 12 * 7 + 5? Use the calculator. The answer is 89. search the web for the "
           "capital of France. Paris is the capital. expression arguments name calc search "
           "query result 0123456789 + - * / ( ) = ? . , : ; \" { } [ ] \n\n hello world you are "
           "a helpful assistant with tools and functions; think step by step.\n")


def make_tokenizer_dir(directory: str, template: str) -> str:
  """Writes tokenizer.json (a byte-level BPE of ~400 tokens trained on a small text, the
  ChatML specials and the tool / think tags as added tokens) and tokenizer_config.json with
  `template` as its chat template; returns the directory."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator([_CORPUS] * 20, trainer)
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in ADDED])
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  config = {"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "bos_token": None}
  with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f)
  return directory

"""Dynamic templating: the small model writes only what it must choose; the rest is injected.

Output format (JSON, because tool names may contain spaces and dots)::

    [{"name": "<tool name>", "arguments": {"<key>": <value>, ...}}, {...}]

It is exactly ``json.dumps(calls, ensure_ascii=False)`` with the default separators (", ", ": "),
arguments ordered as the decoder writes them: required keys in schema (``properties``) order,
then the chosen optional keys, also in schema order. `render_target` renders gold calls so.

The skeleton comes from the candidate tools' *schemas* only. The model (greedy, its logits
restricted to what is allowed at that point) chooses:

- whether to call anything (``[]`` is an option unless the caller requires a call), which offered tool (a trie over the
  JSON-encoded names), how many calls (after each call ``, `` for another or ``]``; capped; a call repeated word for
  word is a greedy loop: it is taken back and the list closed, unless ``stop_on_repeat=False``; the same for an
  array item (string, object or array) that repeats an earlier one; with ``alternatives``, another call is written
  while the request lists an alternative to a value the calls use that none of them uses: alternatives.py);
- which optional parameters to fill (after the required keys are injected, a choice among the
  remaining optional keys, in schema order, or ``}``);
- the values, under type constraints: string (free tokens that are valid JSON string content,
  ending with a token that ends exactly with the closing quote; capped), integer and number (the
  JSON number grammar as a character automaton; a declared float written without a fraction gets
  ``.0``), boolean/enum/null (tries over JSON encodings),
  arrays (items recursively, ``, ``/``]`` chosen after each item; capped), objects with
  properties (like the arguments), free objects and ``any`` (a small depth-limited JSON grammar).

Boilerplate (``[{"name": "``, the rest of a name once its prefix is unique, ``", "arguments": {``,
``"key": ``, punctuation) is never sampled: it is buffered as text and run through the model in
one forward pass together with the last generated token, when the next decision needs logits.

Copy drafting: string and number values are mostly spans of the request, so inside one the
decoder looks the value written so far up in `draft_source` and runs the tokens that follow it there
through the model together with the pending tokens, in one pass (on a CPU a pass over a few
tokens costs about as much as over one). A drafted token is kept only if it is the constrained
argmax at its position, exactly as if it had been stepped; the first mismatch is replaced by the
model's choice and the rest is cropped from the cache. Where the source marks the value's end (a
quote character, punctuation before a space, its own end), the draft runs on through the closing
quote and what the decoder feeds next if its guesses hold (`Follow`): the text the template
injects (``, "next_key": "``, ``}}``) and guessed choices: no more optional keys, another call
while an offered tool is not called yet, that tool (the first not called in the order the request
mentions them, `mention_order`) with its name and first key. Choices are drafted from the same
guesses when their own pass runs. When the guesses are right, one pass writes the end of a value
and everything up to the next value's first token; when not, nothing but speed is lost.

Three kinds of decision, all by the model's logits:

- *step*: argmax over an allowed token set; the token is emitted and fed ("generated").
- *choice among strings* (`_choose`): steps restricted to tokens that keep the text a prefix of
  some option; once a single option is left its remainder is injected. When the text equals an
  option that others extend (integer enum ``1`` vs ``10``) stopping is a *peek*.
- *peek*: compare the best logit of several token sets without emitting any of them, e.g.
  "continue the number" (digit tokens) against "stop" (tokens starting with ``,``/``}``/``]``),
  or, where a value may start in different ways, "close the array" (``]...``) against "another
  item". The winner's set decides; what follows is then injected or stepped. A peek costs no
  forward pass and emits nothing, so the logits of the next position are not needed.

Training targets (`target_token_mask`) run the very same walker in *teacher* mode: decisions
follow the gold calls, tokens follow the natural tokenization of each segment, and no model is
run, so the target ids are exactly the ids the decoder feeds when its logits agree with the
gold (a teacher-forcing test checks this). Its mask marks the tokens whose logits drive the
decoder: generated tokens, plus the token right after each peek decision (e.g. the ``,`` after
a number, the ``"`` opening a string where ``null`` was possible) so the model learns to stop.

Known limits: BPE tokens that are partial UTF-8 sequences (byte fallback pieces) are never
allowed, so a character without a whole-character token cannot appear in a generated string;
an escape sequence must lie within one token; caps (calls, string tokens, array items, number
length, ``any`` depth) truncate; the decoder extends the caller's KV cache in place (pass a
`Backend.fork` to keep it) and does not feed the final tokens of its output.
"""

from hyfunc.cascade.templating.decoder import (
    TemplateDecoder,
    TemplatedOutput,
    render_target,
    target_token_mask,
)
from hyfunc.cascade.templating.session import TemplateError, ValueWriter

__all__ = ["TemplateDecoder", "TemplatedOutput", "render_target", "target_token_mask", "TemplateError", "ValueWriter"]

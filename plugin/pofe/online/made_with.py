"""What made an online refresh's rows, as its refresh.json records it (`made_with`), and how a
resumed run's recipe differs from it (`setting_changes`): a resumed run trains on a written
refresh only when its recipe makes rows alike."""

from __future__ import annotations

import json

from pofe.args import PofeConfig
from pofe.files import weights_fingerprint
from pofe_candidates.manifest import changed_settings, generate_settings, judge_manifest, recorded


def made_with(pofe: PofeConfig, sequence_len: int, *, base_model: str, revision: str | None = None) -> dict:
    """What a refresh's rows depend on besides its window and the policy that sampled it, as
    refresh.json records it (redacted: a served policy's command may carry its --api-key): the
    method, the judge (`judge_manifest`: its settings and its code or weights), the generate
    settings, the candidates' filters, kl_coef (RRHF's rewards use pi_0's log-probs, written
    only with it), the opponents' mixture (`pofe.nash_md`), the tokenisation of the rows
    trained on and, when a refresh scores under pi_0 (`online_scores_pi_0`: its rows hold
    pi_0's log-probs, and Nash-MD's opponents are sampled from it), pi_0's weights: those of
    `base_model` (at `revision`), as `weights_fingerprint` knows them (same folder, other
    weights: another pi_0)."""
    judge = judge_manifest(method=pofe.method, judge=pofe.judge)
    candidates = pofe.candidates.for_method(pofe.method)
    pi_0 = {PI_0: weights_fingerprint(base_model, revision)} if pofe.online_scores_pi_0 else {}
    return recorded(
        {
            ROWS: ROWS_FORMAT,
            **pi_0,
            "method": pofe.method,
            "judge": judge["judge"],
            "judge_identity": judge["judge_identity"],
            "generate": generate_settings(pofe.generate.for_method(pofe.method)),
            "candidates": candidates.model_dump(include={"keep", "min_candidates", "truncated"}),
            "kl_coef": pofe.online.kl_coef,
            # the opponents' mixture (Nash-MD): another mixture_coef samples other opponents
            "nash_md": pofe.nash_md.model_dump() if pofe.nash_md else None,
            "tokenize": {
                "sequence_len": sequence_len,
                "max_prompt_len": pofe.max_prompt_len or sequence_len // 2,
                "truncation": pofe.truncation,
            },
        }
    )


IDENTITY = "judge_identity."
PI_0 = "pi_0_weights"
# the form of rows.jsonl's rows; 2: pi_0's log-probs under `pi_0_logps` (1, unrecorded: `logp_base`)
ROWS, ROWS_FORMAT = "rows_format", 2


def setting_changes(recorded_with: dict, made: dict) -> str:
    """How a refresh's `made_with` differs from `made`, this recipe's: "key: then, now; ...". A
    judge function's or model's digest is said only when its code or weights changed under the
    same name (another function or model is said by its own key); pi_0's, as base_model's weights."""
    said = []
    for key, then, now in changed_settings(recorded_with, made):
        if key == ROWS:
            said.append(
                f"{ROWS}: {then} then, {now} now (an older POFE wrote its rows.jsonl, in a form not read any more)"
            )
        elif key == PI_0:
            was, now = (_short(digest) for digest in (then, now))
            said.append(f"the weights of base_model (pi_0, whose log-probs its rows hold): {was} then, {now} now")
        elif not key.startswith(IDENTITY):
            said.append(f"{key}: {then} then, {now} now")
        elif "unset" not in (then, now):
            was, now = (_short(digest) for digest in (then, now))
            said.append(f"the code or weights of {key[len(IDENTITY) :]} (sha256 {was} then, {now} now)")
    return "; ".join(said)


def _short(digest: str) -> str:
    """A recorded weights or code digest (`changed_settings`' JSON), as a message says it: a sha256's
    first 12 digits; a hub model's "commit <sha>" likewise; "unset" or "not cached" whole."""
    if digest == "unset":
        return digest
    head, _, sha = json.loads(digest).rpartition(" ")
    return f"{head} {sha[:12]}".strip()

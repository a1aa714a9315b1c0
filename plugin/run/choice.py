"""Which iterate to use, and which rounds regressed: read off the held-out comparisons.

The best model is the one with the highest length-controlled win rate against pi_0 on the
held-out prompts (pi_0 itself counts 1/2; the first of equals), so that a round that only
made answers longer does not win; "clearly" better when its whole 95 % interval is above
1/2. A round regresses when its model's length-controlled win rate against the iterate
before it is below 1/2: "clearly" when the whole 95 % interval is, otherwise within noise.
The report warns about each; only `pofe.stop_when` (`pofe.run.stop`) ends a run on one.
"""

from __future__ import annotations


def choose_model(ev: dict | None) -> dict | None:
    """{"best": model index, "name", "lc_vs_pi_0" (and its "lc_ci95"), "raw_vs_pi_0", "clear"
    (the interval's lower end above 1/2), "regressions": [...]} from
    eval.json's `vs_pi_0` / `vs_previous` (`pofe.run.comparisons`); None without them."""
    if not ev or not ev.get("vs_pi_0"):
        return None
    names = [m["name"] for m in ev["models"]]
    scores = [0.5] + [v["lc"] if v and v["lc"] is not None else float("-inf") for v in ev["vs_pi_0"][1:]]
    best = max(range(len(scores)), key=lambda m: (scores[m], -m))
    regressions = []
    for m, v in enumerate(ev["vs_previous"]):
        if v and v["lc"] is not None and v["lc"] < 0.5:
            upper = v["lc_ci95"][1]
            regressions.append({"model": names[m], "previous": names[m - 1], "lc": v["lc"], "lc_ci95": v["lc_ci95"],
                                "clear": upper is not None and upper < 0.5})
    chosen = ev["vs_pi_0"][best] or {}
    lower = (chosen.get("lc_ci95") or [None])[0]
    return {"best": best, "name": names[best], "lc_vs_pi_0": chosen.get("lc"), "lc_ci95": chosen.get("lc_ci95"),
            "raw_vs_pi_0": chosen.get("raw"), "clear": lower is not None and lower > 0.5, "regressions": regressions}

"""One PrivateRec (or other federated) training run on the default synthetic data, with
optional private-serving evaluations: the single-seed probes of BENCHMARKS.md.

Usage::

    python benchmarks/privaterec_probe.py rounds=300 epsilon_train=10 m_basis_size=3 \\
        serve=privaterec:10,vdp:10 [method=dp-fedrec] [data=DIR]

``m_<field>=v`` sets a ModelConfig field, ``serve=kind:eps[:normalization],...`` evaluates
private serving after training, every other ``key=value`` sets a FedConfig field or a setting
of the method. Prints one JSON line and appends it to ``benchmarks/results/privaterec_probe.jsonl``
(``--smoke``: tiny data, 2 rounds, to a temporary directory).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.runs.ranking import evaluate_run, train_run
from privaterec.ondevice.release import ServingConfig

RESULTS = Path(__file__).resolve().parent / "results"


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def main(argv: list[str]) -> None:
    results = RESULTS
    if "--smoke" in argv:  # tiny data, 2 rounds of 4 clients, one served evaluation
        from _smoke import smoke_data, smoke_dir

        argv = [a for a in argv if a != "--smoke"] + [
            "rounds=2", "clients_per_round=4", "serve=privaterec:10", f"data={smoke_data()}"]
        results = smoke_dir("privaterec_probe")
    kw = {k: _value(v) for k, v in (a.split("=", 1) for a in argv)}
    serve = str(kw.pop("serve", ""))
    method = str(kw.pop("method", "privaterec"))
    data = kw.pop("data", None)
    model = {k[2:]: v for k, v in kw.items() if k.startswith("m_")}
    fed = {k: v for k, v in kw.items() if not k.startswith("m_")}
    with tempfile.TemporaryDirectory() as tmp:
        if data is None:
            data = str(Path(tmp) / "synth")
            write_synthetic(Path(data), SynthConfig(seed=0))
        config = RunConfig(data=str(data), model=ModelConfig(news_encoder="nrms", **model),
                           train=TrainConfig(method=method), fed=fed_config(method, **fed))
        run = Path(tmp) / "run"
        started = time.perf_counter()
        metrics = train_run(config, run, progress=False)
        out = {"command": " ".join(["python", "benchmarks/privaterec_probe.py", *argv]),
               "auc": round(metrics["test"]["auc"], 4),
               "seconds": round(time.perf_counter() - started, 1)}
        for spec in filter(None, serve.split(",")):
            kind, eps, *norm = spec.split(":")
            serving = ServingConfig(kind=kind, epsilon=float(eps),
                                    normalization=norm[0] if norm else "softplus")
            out[f"serve {spec}"] = round(evaluate_run(run, progress=False,
                                                      serving=serving)["auc"], 4)
    print(json.dumps(out), flush=True)
    results.mkdir(exist_ok=True)
    with open(results / "privaterec_probe.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

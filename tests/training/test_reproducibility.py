"""Same seed → same parameters across processes, with PyTorch's default two CPU threads.

Multithreaded CPU kernels may reduce in a nondeterministic order; within one process two
runs can agree while two processes differ. This test trains in two fresh interpreters (with
different hash seeds) and compares parameter checksums bit for bit.
"""

import os
import subprocess
import sys

import pytest

from privaterec.data.synth import SynthConfig, write_synthetic

SCRIPT = """
import hashlib, sys, torch
from privaterec.config import RunConfig, TrainConfig
from privaterec.models.factory import build_recommender
from privaterec.training.centralized import train_centralized
from privaterec.runs.ranking import prepare_data
torch.set_num_threads(2)
prepared = prepare_data(RunConfig(data=sys.argv[1]))
torch.manual_seed(0)
model = build_recommender(RunConfig().model, prepared.vocabs, prepared.features)
train_centralized(model, prepared.train_clients, TrainConfig(epochs=1), progress=False,
                  stop_after_steps=30)
flat = torch.cat([v.flatten().double() for v in model.state_dict().values()])
print(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_training_is_bitwise_reproducible_across_processes(tmp_path):
    write_synthetic(tmp_path / "data", SynthConfig(users=400, news=800, seed=1))
    digests = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "data")],
                             capture_output=True, text=True, env=env, check=True)
        digests.append(out.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]

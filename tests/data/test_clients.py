import torch

from privaterec.data.clients import build_client_dataset
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.privacy.samplers import SimulationNoise


def _clients(split, history_len=3):
    vocabs = build_vocabularies(split.news.values())
    features = build_news_features(split.news, vocabs, title_len=6, abstract_len=4)
    return features, build_client_dataset(split, features, history_len=history_len)


def test_samples_pair_each_click_with_its_impression_negatives(tiny_split):
    features, clients = _clients(tiny_split)
    assert clients.user_ids == ["U1", "U2", "U3"]
    # U1: 1 click + 1 click; U2: 2 clicks + 1 click; U3: impression without negatives skipped
    assert clients.samples_per_user().tolist() == [2, 3, 0]
    assert clients.skipped["impressions_without_non_click"] == 1
    row = features.row
    assert clients.positives.tolist() == [row["N3"], row["N7"], row["N8"], row["N9"], row["N6"]]
    assert clients.negative_counts.tolist() == [2, 1, 2, 2, 1]
    assert clients.impression_size.tolist() == [3, 2, 4, 4, 2]
    assert clients.offsets.tolist() == [0, 2, 5, 5]


def test_history_is_latest_impression_history_right_aligned(tiny_split):
    features, clients = _clients(tiny_split, history_len=3)
    row = features.row
    # U2's latest impression (id 5) has history (N3,)
    assert clients.history[1].tolist() == [0, 0, row["N3"]]
    assert clients.history_mask[1].tolist() == [False, False, True]
    assert clients.history[0].tolist() == [0, row["N1"], row["N2"]]


def test_draw_candidates_uses_only_the_impressions_negatives_and_is_seeded(tiny_split):
    features, clients = _clients(tiny_split)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = clients.draw_candidates(negatives=4, noise=SimulationNoise(g1))
    b = clients.draw_candidates(negatives=4, noise=SimulationNoise(g2))
    assert torch.equal(a, b)
    assert a.shape == (5, 5)
    assert torch.equal(a[:, 0], clients.positives)
    for s in range(5):
        allowed = set(clients.negatives[s, : clients.negative_counts[s]].tolist())
        assert set(a[s, 1:].tolist()) <= allowed


def test_draw_without_replacement_when_enough_negatives(tiny_split):
    features, clients = _clients(tiny_split)
    for seed in range(20):
        c = clients.draw_candidates(negatives=2,
                                    noise=SimulationNoise(torch.Generator().manual_seed(seed)))
        for s in range(5):
            if clients.negative_counts[s] >= 2:
                assert len(set(c[s, 1:].tolist())) == 2

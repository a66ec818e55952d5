"""privaterec.recall: Uni-FedRec's recall model, its serving and its evaluation."""

from privaterec.ondevice.release import QUERY_MODES

RECALL_METHODS: tuple[str, ...] = ("unifedrec", "youtubenet", "no-bie", *QUERY_MODES)
"""Uni-FedRec, YoutubeNet, the no-BIE ablation and every serving mode that sends one query."""

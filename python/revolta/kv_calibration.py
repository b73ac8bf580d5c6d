"""Prompts for calculate_kv_scales: a few short texts of different kinds (prose, code, a dialogue,
figures), so that the K / V ranges measured are not those of one register only."""

from __future__ import annotations

CALIBRATION_TEXTS = [
    "The harbour was quiet that morning. Fishing boats rocked against the pier while gulls argued over "
    "the nets, and an old man mended a sail with slow, careful stitches, humming a song about the tides.",
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
    "User: Can you help me plan a three-day trip to the mountains?\nAssistant: Of course! Day one: arrive, "
    "settle in and take a short walk by the lake. Day two: a longer hike to the ridge. Day three: rest.",
    "Quarterly figures: revenue 4,812,300 (+6.4%), costs 3,905,120 (+2.1%), margin 18.9%; units shipped "
    "72,415; returns 1.3%; regions: north 41%, south 27%, east 19%, west 13%.",
]


def calibration_prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(t) for t in CALIBRATION_TEXTS]

"""Regenerates this "bring your own dataset" example of raw values: ``train.csv`` and ``test.csv``.

    python feature_specs/byo_raw_example/make_raw_example.py

Rows are drawn from a seeded generator: a city name (Zipf-like, ten cities), a shop URL (300 sites),
a device, a raw price and a visit count (``-1`` marks "unknown", as Criteo's counts do). The click
depends on the city, on the site and on the price, so a model that learns the encoded columns beats
chance. The two specs next to this file describe the same CSVs: ``feature_spec.yaml`` numbers the
strings with ``encode: vocabulary`` (fixed tables), ``feature_spec_hashed.yaml`` hashes them with
``encode: hash`` (dynamic tables).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CITIES = ["Lyon", "Oslo", "Kyoto", "Lima", "Perth", "Quito", "Turin", "Accra", "Bergen", "Cork"]
DEVICES = ["phone", "tablet", "desktop"]
HEADER = "clicked,price,visits,city,url,device"


def rows(count: int, rng: np.random.Generator, city_effect: dict) -> list[str]:
    lines = []
    for _ in range(count):
        city = CITIES[min(int(rng.zipf(1.5)) - 1, len(CITIES) - 1)]
        site = int(rng.integers(0, 300))
        price = float(rng.lognormal(3, 1))
        visits = int(rng.integers(-1, 40))
        device = DEVICES[int(rng.integers(0, 3))]
        logit = city_effect[city] + (0.8 if site % 3 == 0 else -0.4) - 0.1 * np.log1p(price) + 0.02 * max(visits, 0)
        clicked = int(rng.random() < 1 / (1 + np.exp(-logit)))
        item = site * 7 + int(rng.integers(0, 4))  # about 1,200 URLs: some are seen once (min_count)
        lines.append(f"{clicked},{price:.2f},{visits},{city},https://shop{site}.example.com/item/{item},{device}")
    return lines


def build(directory: str, train_rows: int = 4000, test_rows: int = 1000, seed: int = 2024) -> None:
    rng = np.random.default_rng(seed)
    city_effect = {city: float(rng.normal(0, 1.5)) for city in CITIES}
    for name, count in (("train.csv", train_rows), ("test.csv", test_rows)):
        with open(os.path.join(directory, name), "w", encoding="utf-8", newline="\n") as handle:
            handle.write("\n".join([HEADER] + rows(count, rng, city_effect)) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default=HERE)
    build(parser.parse_args().output_dir)

"""A small csv of raw values for the transcode tests: city names, URLs, raw prices and counts.

The label depends on the city (strongly), on the site and on the price, so a model that learns the
encoded columns beats chance. Columns: ``clicked,price,visits,city,url,device``; ``visits`` holds
negative values (a "missing" marker, as in Criteo's counts) that ``log1p`` must be told to clip.
"""

from __future__ import annotations

import numpy as np
import yaml

CITIES = [f"City {name}" for name in ("Lyon", "Oslo", "Kyoto", "Lima", "Perth", "Quito", "Turin", "Accra", "Bergen", "Cork")]
COLUMNS = ["clicked", "price", "visits", "city", "url", "device"]


def write_csv(path, rows: int, rng: np.random.Generator, effects: dict, extra_city: str | None = None) -> None:
    lines = [",".join(COLUMNS)]
    for row in range(rows):
        city = CITIES[min(int(rng.zipf(1.5)) - 1, len(CITIES) - 1)]
        if extra_city and row % 50 == 0:
            city = extra_city  # seen outside train only: maps to the out-of-vocabulary id
        site = int(rng.integers(0, 300))
        price = float(rng.lognormal(2, 1))
        visits = int(rng.integers(-1, 40))
        device = ("phone", "tablet", "desk\ttop")[int(rng.integers(0, 3))]
        logit = effects.get(city, 0.0) + (0.8 if site % 3 == 0 else -0.4) - 0.1 * np.log1p(price)
        label = int(rng.random() < 1 / (1 + np.exp(-logit)))
        lines.append(f"{label},{price:.3f},{visits},{city},https://shop{site}.example/item?id={site * 7},{device}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_dataset(directory, rows: int = 6000, seed: int = 0, encode=None, transform=None, dynamic: bool = False,
                  train_files: int = 1) -> str:
    """Writes ``train*.csv``, ``test.csv`` and ``spec.yaml``; returns the spec's path.

    ``dynamic`` declares the categoricals dynamic tables (for ``encode: hash``); otherwise they are
    fixed tables whose cardinality comes from ``encode: vocabulary``.
    """
    rng = np.random.default_rng(seed)
    effects = {city: rng.normal(0, 1.5) for city in CITIES}
    train = [f"train{i}.csv" for i in range(train_files)]
    for index, name in enumerate(train):
        write_csv(directory / name, rows // train_files, rng, effects)
    write_csv(directory / "test.csv", rows // 3, rng, effects, extra_city="City Nowhere")
    if dynamic:
        encode = encode or {"city": "hash", "url": "hash", "device": "hash"}  # a model is all dynamic or all fixed
        table = {"dtype": "int64", "dynamic": True, "capacity": 1000}
        categorical = {"city": dict(table), "url": dict(table), "device": dict(table)}
    else:
        encode = encode or {"city": "vocabulary", "url": {"type": "vocabulary", "min_count": 3, "oov": "last"},
                            "device": "vocabulary"}
        categorical = {"city": {"dtype": "int32"}, "url": {}, "device": {}}
        categorical = {name: {k: v for k, v in entry.items()} for name, entry in categorical.items()}
    transform = transform if transform is not None else {"price": "log1p", "visits": [{"clip": [0, None]}, "log1p"]}
    features = {"clicked": {"dtype": "bool"}, "price": {"dtype": "float32"}, "visits": {"dtype": "float32"}}
    for name, entry in categorical.items():
        features[name] = entry if entry else {"dtype": "int64"}
    spec = {
        "feature_spec": features,
        "channel_spec": {"label": ["clicked"], "numerical": ["price", "visits"], "categorical": ["city", "url", "device"]},
        "source_spec": {
            split: [{"type": "csv", "features": COLUMNS, "files": files, "header": True, "encode": encode,
                     "transform": transform}]
            for split, files in (("train", train), ("test", ["test.csv"]))
        },
    }
    (directory / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(directory / "spec.yaml")

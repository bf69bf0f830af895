"""Regenerates this "bring your own dataset" example from the Kaggle-style Criteo sample.

    python feature_specs/byo_example/make_byo_example.py [--sample=../shared/data/criteo_kaggle_sample_200.csv]

(the default sample is in ``$TF_DLRM_CRITEO_SAMPLES``, else ``../shared/data`` beside the repository).

Runs ``preprocessing.criteo`` on the sample (frequency threshold 2, last 20% of rows as test), then
writes the result back out as plain CSV with integer ids: ``train.csv``, ``test.csv`` and the
``feature_spec.yaml`` that describes them (``type: csv`` chunks), i.e. the files a user brings.
Numerical values are written as the shortest decimal that reads back to the same float16, so
``python -m tf_dlrm.data.transcode`` on this example rebuilds the preprocessed files bit for bit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
DEFAULT_SAMPLE = os.path.join(os.environ.get("TF_DLRM_CRITEO_SAMPLES") or os.path.join(REPOSITORY, "..", "shared", "data"),
                              "criteo_kaggle_sample_200.csv")
LABEL = "clicked"
NUMERICAL = [f"i{k}" for k in range(1, 14)]
CATEGORICAL = [f"c{k}" for k in range(1, 27)]
HEADER_COMMENT = """\
# A "bring your own dataset" example: plain CSV files with a header, integer categorical ids.
# Made from the Criteo Kaggle sample by feature_specs/byo_example/make_byo_example.py (do not edit by hand).
# Convert to split_binary, then train:
#   python -m tf_dlrm.data.transcode --input_spec=feature_specs/byo_example/feature_spec.yaml --output_dir=/tmp/byo
#   python main.py --dataset_path=/tmp/byo
# Cells: label 0/1; numerical values are numbers stored as given (here already log(1 + x)); categorical
# values are ids in [0, cardinality). Feature names are free; `features` lists the CSV columns in order.
"""


def build(sample: str, directory: str) -> None:
    sys.path.insert(0, REPOSITORY)
    from preprocessing.criteo import PreprocessConfig, preprocess
    from tf_dlrm.spec.feature_spec import FeatureSpec

    with tempfile.TemporaryDirectory() as scratch:
        preprocessed = os.path.join(scratch, "preprocessed")
        preprocess(PreprocessConfig(inputs=(sample,), output_dir=preprocessed, frequency_threshold=2, test_fraction=0.2))
        spec = FeatureSpec.load(os.path.join(preprocessed, "feature_spec.yaml"))
        for split in spec.splits:
            files = spec.split_files(split)
            label = np.fromfile(files.label, dtype=np.uint8)
            numerical = np.fromfile(files.numerical, dtype=np.float16).reshape(-1, len(NUMERICAL))
            categorical = [np.fromfile(p, dtype=spec.dtype(f)) for p, f in zip(files.categorical, spec.categorical_features)]
            with open(os.path.join(directory, f"{split}.csv"), "w", encoding="utf-8", newline="\n") as stream:
                stream.write(",".join([LABEL] + NUMERICAL + CATEGORICAL) + "\n")
                for row in range(label.shape[0]):
                    cells = [str(int(label[row]))] + [str(v) for v in numerical[row]]  # shortest float16 repr
                    cells += [str(int(column[row])) for column in categorical]
                    stream.write(",".join(cells) + "\n")
        features = {LABEL: {"dtype": "bool"}}
        features.update({name: {"dtype": "float16"} for name in NUMERICAL})
        for name, cardinality in zip(CATEGORICAL, spec.cardinalities()):
            features[name] = {"dtype": "int32", "cardinality": cardinality}
        byo = {
            "feature_spec": features,
            "channel_spec": {"label": [LABEL], "numerical": NUMERICAL, "categorical": CATEGORICAL},
            "source_spec": {
                split: [{"type": "csv", "features": [LABEL] + NUMERICAL + CATEGORICAL, "files": [f"{split}.csv"], "header": True}]
                for split in spec.splits
            },
            "metadata": {"made_from": "criteo_kaggle_sample_200.csv via preprocessing.criteo (frequency_threshold 2)"},
        }
    with open(os.path.join(directory, "feature_spec.yaml"), "w", encoding="utf-8") as stream:
        stream.write(HEADER_COMMENT)
        yaml.safe_dump(byo, stream, sort_keys=False, default_flow_style=None, width=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", default=DEFAULT_SAMPLE)
    parser.add_argument("--output_dir", default=HERE)
    args = parser.parse_args()
    build(os.path.abspath(args.sample), args.output_dir)


if __name__ == "__main__":
    main()

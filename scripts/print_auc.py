"""Prints the demo's final validation AUC next to the synthetic dataset's oracle AUC."""

import json
import sys

import yaml


def main(log_path: str, spec_path: str) -> int:
    with open(log_path, encoding="utf-8") as handle:
        final = json.loads(handle.read().strip().splitlines()[-1])
    with open(spec_path, encoding="utf-8") as handle:
        oracle = yaml.safe_load(handle)["metadata"]["oracle_valid_auc"]
    print(f"validation AUC {final['auc']:.4f} (oracle {oracle:.4f}, gap {oracle - final['auc']:.4f}); "
          f"{final['train_samples_per_s']:,.0f} samples/s on {final['world_size']} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

"""Prints the demo's held-out AUC next to the synthetic dataset's oracle AUC on the same split.

    python scripts/print_auc.py LOG_JSONL FEATURE_SPEC_YAML

The figure is the test split's (``test_auc`` of main.py's final record: evaluated once, at the state the
validation split chose) when the run had one, else the evaluated split's; the oracle is the AUC of the hidden
model that drew the labels, on that split's own labels (``oracle_test_auc`` or ``oracle_valid_auc``).
"""

import json
import sys

import yaml


def reported_figure(final: dict, metadata: dict) -> tuple[str, float, float | None]:
    """``(label, AUC, oracle AUC)`` of the split the run reports as held-out."""
    if final.get("test_auc") is not None:
        return f"test ({final.get('test_split', 'test')})", final["test_auc"], metadata.get("oracle_test_auc")
    split = final.get("split") or "validation"
    # A dataset of train and test only: main.py evaluates test without choosing by it.
    oracle = metadata.get("oracle_test_auc") if split == "test" else metadata.get("oracle_valid_auc")
    return f"{'test' if split == 'test' else 'validation'} ({split})", final["auc"], oracle


def describe(final: dict, metadata: dict) -> str:
    label, auc, oracle = reported_figure(final, metadata)
    versus = f"oracle {oracle:.4f}, gap {oracle - auc:.4f}" if oracle is not None else "no oracle AUC for this split"
    chosen = (f"state of step {final['best_step']} of {final['steps']}, chosen on {final['selected_on']}"
              if final.get("selected_on") and final.get("best_step") is not None else f"state of step {final['steps']}")
    return (f"{label} AUC {auc:.4f} ({versus}; {chosen}); "
            f"{final['train_samples_per_s']:,.0f} samples/s on {final['world_size']} ranks")


def main(log_path: str, spec_path: str) -> int:
    with open(log_path, encoding="utf-8") as handle:
        final = json.loads(handle.read().strip().splitlines()[-1])
    with open(spec_path, encoding="utf-8") as handle:
        metadata = yaml.safe_load(handle).get("metadata") or {}
    print(describe(final, metadata))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

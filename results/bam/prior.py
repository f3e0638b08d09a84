"""BAM's learned prior beside ALiBi's lines: prior.csv (per seed and head: scale exp(theta_alpha), shape
theta_beta, location mu, each head's ALiBi slope) and plots/prior.png (the bias -scale * d^shape against
distance, to 512x the training length, each head beside the ALiBi line it started from).

    python results/bam/prior.py            # from results/bam's checkpoints (after regenerate.sh), then the plot;
                                           # a (variant, seed) with no checkpoint here keeps its committed rows
    python results/bam/prior.py --plot     # the plot alone, from the committed prior.csv
    python results/bam/prior.py --run-dir results/bam-mqar   # another run's: prior.csv and plots/ there
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
COLUMNS = ["variant", "seed", "head", "scale", "shape", "mu", "alibi_slope"]


def read_checkpoints(run_dir: Path) -> pd.DataFrame:
    from relbench.positions.alibi import slopes
    from relbench.runs import checkpoints

    rows = []
    for folder in sorted((run_dir / "checkpoints").glob("bam*-seed*")):
        if not (folder / "model.pt").exists():
            continue
        model = checkpoints.load_model(folder, "cpu")
        prior = model.positions[0]
        theta_alpha, theta_beta, mu = (t.detach() for t in (prior.theta_alpha, prior.theta_beta, prior.mu))
        meta = checkpoints.read_meta(folder) or {}
        spec, seed = meta.get("variant", folder.name), meta.get("seed", int(folder.name.rsplit("seed", 1)[1]))
        start = slopes(prior.n_heads)
        for head in range(prior.n_heads):
            rows.append({"variant": spec, "seed": seed, "head": head,
                         "scale": float(theta_alpha[head].exp()), "shape": float(theta_beta[head]),
                         "mu": float(mu[head]), "alibi_slope": float(start[head])})
    return pd.DataFrame(rows, columns=COLUMNS)


def update(path: Path, found: pd.DataFrame) -> None:
    """Write prior.csv: the rows read from the checkpoints, and the committed rows of every (variant, seed)
    whose checkpoint is not here (a run folded in by `relbench merge` brings only its own checkpoints)."""
    if path.exists():
        kept, read = pd.read_csv(path), set(zip(found["variant"], found["seed"]))
        kept = kept[[key not in read for key in zip(kept["variant"], kept["seed"])]]
        found = pd.concat([frame for frame in (kept, found) if not frame.empty] or [found], ignore_index=True)
    found.sort_values(["variant", "seed", "head"], kind="stable").to_csv(path, index=False)


def train_length(run_dir: Path) -> int:
    import json

    return int(json.loads((run_dir / "config.json").read_text())["model"]["train_length"])


def plot(frame: pd.DataFrame, out: Path, length: int = 128) -> None:
    """Each head's penalty to 512x the training length `length`."""
    d = torch.logspace(0, torch.log10(torch.tensor(float(512 * length))), 200)
    variants = list(dict.fromkeys(frame["variant"]))
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4.5), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        mine = frame[frame["variant"] == variant]
        for row in mine.itertuples():
            bias = -row.scale * ((d - row.mu).abs() + 1e-5) ** row.shape
            line, = ax.plot(d, -bias, label=f"seed {row.seed} head {row.head}: {row.scale:.4f} d^{row.shape:.2f}")
            ax.plot(d, row.alibi_slope * d, color=line.get_color(), linestyle=":", linewidth=1)
        ax.axvline(length, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"distance i - j (training length {length}: grey line)")
        ax.set_ylabel("penalty -b(d), nats (dotted: the ALiBi line it started from)")
        ax.set_title(f"{variant}: learned prior per head")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", action="store_true", help="plot the committed prior.csv only")
    parser.add_argument("--run-dir", type=Path, default=HERE, help="the run (prior.csv and plots/prior.png go there)")
    args = parser.parse_args()
    if not args.plot:
        update(args.run_dir / "prior.csv", read_checkpoints(args.run_dir))
    plot(pd.read_csv(args.run_dir / "prior.csv"), args.run_dir / "plots" / "prior.png", train_length(args.run_dir))


if __name__ == "__main__":
    main()

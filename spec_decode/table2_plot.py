"""A Table 2 sweep's plot, table2.png: speedup against gamma.

A panel per task, temperature and batch size; in each, a line per draft,
measured (solid) and Theorem 3.8's (dashed).
"""

import itertools

from matplotlib import figure
from matplotlib import lines as mlines
from matplotlib import ticker

from spec_decode import table2_best


def plot(rows, path):
  """Speedup against gamma: a panel per task x temperature x batch size.

  Args:
    rows: the sweep's points.
    path: the PNG to write.
  """
  tasks = list(dict.fromkeys(row["task"] for row in rows))
  settings = list(
      dict.fromkeys((row["temperature"], row["batch_size"]) for row in rows)
  )
  drafts = list(dict.fromkeys(row["draft"] for row in rows))
  colors = {draft: f"C{i}" for i, draft in enumerate(drafts)}
  # Wide enough for the legend under a single panel.
  fig = figure.Figure(
      figsize=(max(3.2 * len(settings), 5.5), 2.8 * len(tasks) + 0.8),
      layout="constrained",
  )
  axes = fig.subplots(len(tasks), len(settings), squeeze=False, sharey=True)
  groups = table2_best.groups(rows)
  for key, group in groups.items():
    task, temperature, batch_size, draft = key[:4]
    # 'auto' points stand apart from the sweep over gamma.
    group = [row for row in group if row.get("gamma_policy") != "auto"]
    ax = axes[tasks.index(task), settings.index((temperature, batch_size))]
    gammas = [row["gamma"] for row in group]
    ax.plot(
        gammas,
        [row["speedup"] for row in group],
        color=colors[draft],
        marker="o",
        markersize=3,
    )
    ax.plot(
        gammas,
        [row["predicted_speedup"] for row in group],
        color=colors[draft],
        linestyle="--",
    )
  _label(axes, tasks, settings)
  _legend(fig, drafts, colors)
  fig.savefig(path, dpi=120)


def _label(axes, tasks, settings):
  """Each panel's title, axes and grid; the left column's y label."""
  for (task, (temperature, batch_size)), ax in zip(
      itertools.product(tasks, settings), axes.flat
  ):
    ax.axhline(1.0, color="0.6", linewidth=0.8, linestyle=":")
    ax.set_title(f"{task}, T={temperature:g}, batch {batch_size}", fontsize=9)
    ax.set_xlabel("gamma")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  for ax in axes[:, 0]:
    ax.set_ylabel("speedup")


def _legend(fig, drafts, colors):
  """Under the panels: a color per draft; solid measured, dashed Thm 3.8."""
  handles = [
      mlines.Line2D([], [], color=colors[draft], label=f"{draft} draft")
      for draft in drafts
  ] + [
      mlines.Line2D([], [], color="k", label="measured"),
      mlines.Line2D([], [], color="k", linestyle="--", label="Theorem 3.8"),
  ]
  fig.legend(
      handles=handles, loc="outside lower center", ncols=max(len(drafts), 2)
  )

"""Loss-landscape plots around the final weights, along PCA directions of training trajectories.

QZO-FF (§4.2 "Loss landscape", App. E, Fig. 6) draws the 2-D contours of the loss around the
final weights, together with the BP and forward-gradient (FF) trajectories, following the
trajectory-PCA variant of Li et al. 2018 ("Visualizing the Loss Landscape of Neural Nets", §7):

1. record the trained parameters after every step (or every ``every`` steps) with
   :class:`TrajectoryRecorder`;
2. :func:`pca_directions`: the first two principal directions of the snapshots' offsets
   ``snapshot - center`` from the final point ``center``;
3. :func:`project`: each snapshot's coordinates ``(a, b)`` in that plane;
4. :func:`loss_surface`: ``loss(center + a d1 + b d2)`` on a grid covering the projected
   trajectories plus a margin;
5. :func:`plot_landscape`: filled contours with the trajectories drawn on them, as PNG.

:func:`landscape_figure` chains the five steps.

**Two trajectories, one plane.** Li et al. take the PCA of *one* trajectory, centred at its
final point. To draw BP and FF on the *same* contour plot they must share the plane, so
:func:`pca_directions` pools the snapshots of all given trajectories into one matrix and takes
its PCA about a *given* centre (normally the final weights of the run whose landscape is drawn)
rather than about the snapshots' mean. The "explained variance" is therefore the share of the
pooled sum of squared distances to that centre, ``sum ||x - center||^2``, carried by each
direction; it reduces to Li et al.'s construction when one trajectory is given. Directions are
orthonormal, so the plot's axes are Euclidean distances in parameter space (no filter
normalisation: Li et al. use it for random directions, not for the PCA ones).

Coordinates come back as numpy float64 arrays; directions as float64 tensors on the centre's
device, which :func:`set_flat_params_` casts to each parameter's own dtype.

The package's parts: :mod:`.trajectory` (steps 1-3) and :mod:`.surface` (steps 4-5 and
:func:`landscape_figure`).
"""

from .surface import landscape_figure, loss_surface, plot_landscape
from .trajectory import (TrajectoryRecorder, flatten_params, pca_directions, project,
                         set_flat_params_)

__all__ = ["TrajectoryRecorder", "flatten_params", "landscape_figure", "loss_surface",
           "pca_directions", "plot_landscape", "project", "set_flat_params_"]

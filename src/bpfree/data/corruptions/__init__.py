"""Common image corruptions at five severities, after ImageNet-C / CIFAR-10-C and MNIST-C.

The corruptions and their severity tables follow Hendrycks & Dietterich, "Benchmarking Neural
Network Robustness to Common Corruptions and Perturbations" (ICLR 2019; the CIFAR-10-C
generator ``make_cifar_c.py`` in github.com/hendrycks/robustness) and Mu & Gilmer, "MNIST-C: A
Robustness Benchmark for Computer Vision" (2019; ``corruptions.py`` in
github.com/google-research/mnist-c, whose full table covers every severity at 28x28). They are
re-implemented with numpy/scipy only (no OpenCV, ImageMagick or scikit-image), vectorized
over the batch, and seeded per image.

Usage::

    from bpfree.data import load_mnist
    from bpfree.data.corruptions import corrupt, list_corruptions

    images, labels = load_mnist(split="test")                 # uint8 [10000, 28, 28]
    foggy = corrupt(images, "fog", 5, seed=0)                 # uint8 [10000, 28, 28]
    for name in list_corruptions(grayscale=True):
        x = corrupt(images[:1000], name, 5)

Images
------
``[N, H, W]`` (grayscale) or ``[N, H, W, C]`` with ``C`` = 1 or 3 (channels last, as
CIFAR-10-C stores them), as a numpy array or a torch tensor (any device). ``uint8`` images
hold 0..255; floating images (float16/32/64, torch bfloat16) hold 0..1. The result has the
input's type, shape, dtype (and device), and the same value range: ``uint8`` outputs are
rounded to nearest (the reference truncates with ``np.uint8``, a -0.5 bias we don't copy).
Channels-first ``[N, C, H, W]`` tensors are rejected with a hint to permute them.

Randomness
----------
Image ``i`` of the batch draws from its own generator, seeded by ``(seed, corruption name,
start_index + i)``. So the same ``(images, name, severity, seed)`` gives bit-identical output;
an image's corruption does not depend on the other images in the batch or the batch size; and a
dataset corrupted in chunks (``start_index`` = the chunk's offset) equals the dataset corrupted
in one call. Different corruptions use independent streams for the same ``seed``.

Severity tables
---------------
Three tables, chosen with ``table=``.

* ``"mnist-c"`` (the default) holds, for most corruptions, ImageNet-C's severity constants
  (Hendrycks & Dietterich's ``make_imagenet_c.py``, designed for 224x224 photographs), which
  MNIST-C's generator reuses unchanged on 28x28 digits: Gaussian std .38, contrast x.05 and a
  radius-10 defocus disk at severity 5. Pixel-valued constants are therefore about 8x stronger
  relative to the image than on ImageNet; MNIST-C argues digits need it (Mu & Gilmer 2019,
  Sec. 3). Exceptions, noted below: pixelate, elastic_transform, fog, the geometric ones.
* ``"cifar10-c"`` is CIFAR-10-C's table verbatim (``make_cifar_c.py``, made for 32x32
  colour images): Gaussian std .10, contrast x.15, defocus radius 1.5 at severity 5.
* ``"pmt-mnist"`` holds severity 5 only: each of PMT Table 7's ten corruptions at the strength
  where ``bpfree bench pmt``'s INT8 MNIST CNN loses as much accuracy as the paper's model did
  (calibrated on training images, :mod:`bpfree.data.calibration`; see :data:`PMT_MNIST`).

Pixel-valued parameters are used as given for the table's native size (28 px and 32 px) and
not rescaled to the image: scaling CIFAR's disk radius 1 by 28/32 would make it 0.875, a
single-pixel disk, and collapse severity 4 of defocus blur into severity 3. Parameters marked
"x size" are fractions of ``min(H, W)`` in both tables, so they adapt to any image size.

=================  ================================  =========================================
corruption         mnist-c, severity 1..5            cifar10-c, severity 1..5
=================  ================================  =========================================
gaussian_noise     std .08 .12 .18 .26 .38           std .04 .06 .08 .09 .10
shot_noise         photons 60 25 12 5 3              photons 500 250 100 75 50
impulse_noise      fraction .03 .06 .09 .17 .27      fraction .01 .02 .03 .05 .07
speckle_noise      std .15 .20 .35 .45 .60           std .06 .10 .12 .16 .20
gaussian_blur      sigma 1 2 3 4 6                   sigma .4 .6 .7 .8 1
glass_blur         (sigma, delta, iters, p_swap)     (sigma, delta, iters), every pixel swaps
                   (.7,1,2,.5) (.9,2,1,.5)           (.05,1,1) (.25,1,1) (.4,1,1) (.25,1,2)
                   (1,2,3,.5) (1.1,3,2,.5)           (.4,1,2)
                   (1.5,4,2,.5)
defocus_blur       (radius, alias sigma) (3,.1)      (.3,.4) (.4,.5) (.5,.6) (1,.2) (1.5,.1)
                   (4,.5) (6,.5) (8,.5) (10,.5)
motion_blur        (radius, sigma) (10,3) (15,5)     (6,1) (6,1.5) (6,2) (8,2) (9,2.5)
                   (15,8) (15,12) (20,15)
zoom_blur          np.arange(1, stop, step) zooms,   np.arange(1, stop, .01) zooms,
                   (stop, step) (1.11,.01)           stop 1.06 1.11 1.16 1.21 1.26
                   (1.16,.01) (1.21,.02) (1.26,.02)
                   (1.31,.03)
fog                (amount, decay) (1.5,2) (2,2)     (.2,3) (.5,3) (.75,2.5) (1,2) (1.5,1.75)
                   (2.5,1.7) (2.5,1.5) (3,1.4)
contrast           factor .4 .3 .2 .1 .05            factor .75 .5 .4 .3 .15
brightness         +V .1 .2 .3 .4 .5                 +V .05 .1 .15 .2 .3
saturate (colour)  (S x, S +) (.3,0) (.1,0) (2,0)    (.3,0) (.1,0) (1.5,0) (2,.1) (2.5,.2)
                   (5,.1) (20,.2)
jpeg_compression   quality 25 18 15 10 7             quality 80 65 58 50 40
pixelate           x size .54 .43 .36 .33 .22        x size .95 .9 .85 .75 .65
elastic_transform  (alpha, sigma, affine) x size     (alpha, sigma, affine) x size
                   (.4,1/7,.02) (.6,1/7,.03)         (0,0,.08) (.05,.2,.07) (.08,.06,.06)
                   (.8,1/7,.04) (1,1/7,.05)          (.1,.04,.05) (.1,.03,.03)
                   (1.2,1/7,.06)
rotate             radians .2 .4 .6 .8 1, random     --
                   sign
shear              radians .2 .4 .6 .8 1, random     --
                   sign
scale              zoom-out 1/.9 1/.8 1/.7 1/.6 1/.5 --
translate          pixels (at 28 px) 1 2 3 4 5,      --
                   random diagonal
quantize           bits 5 4 3 2 1                    --
=================  ================================  =========================================

Where this differs from the references, and why:

* ``elastic_transform``: both references' tables are not monotone (their affine jitter
  *shrinks* with severity while the elastic part grows, and at 28-32 px a smoothing sigma of
  0.2 x size leaves almost no elastic displacement). The mnist-c table here is Simard, Steinkraus
  & Platt (2003)'s classic MNIST distortion (alpha = 34 px, sigma = 4 px at 28 px) as severity
  5 scaled down linearly, plus an affine jitter that grows with severity; the cifar10-c table
  is CIFAR-10-C's, verbatim. The affine and elastic warps are composed into one bilinear
  resampling (the reference resamples twice).
* ``pixelate``: MNIST-C's sizes (.6 .5 .4 .3 .25 -> 16, 14, 11, 8, 7 px) are not monotone:
  16 and 8 px grids alias with PIL's BOX resize and distort digits more than 14 and 7 px (1 -
  correlation with the clean image on MNIST test: .13 > .10 and .30 > .28; the same on
  Fashion-MNIST). The mnist-c table uses 15, 12, 10, 9, 6 px instead, monotone on both and
  spanning the same range.
* ``fog``: the plasma fractal (diamond-square, with the reference's ``wibble**2`` noise
  scale) is drawn at the next power of two >= max(H, W) and cropped, as CIFAR-10-C does at
  32 px; MNIST-C crops 28x28 out of a 256x256 fractal, which leaves mostly one smooth gradient.
* ``motion_blur``: ImageMagick's ``MotionBlurImage`` (a one-sided Gaussian-weighted line of
  ``2 * ceil(radius) + 1`` taps at a random angle in [-45, 45] degrees, edge pixels repeated
  past the border), implemented as shifted sums.
* ``defocus_blur``: the reference's aliased disk anti-aliased with a ``ksize`` 3 (5 for
  radius > 8) Gaussian as ``cv2.GaussianBlur`` does; borders mirror (OpenCV's default).
* ``glass_blur``: the reference's sequential local pixel swaps, reproduced per image
  (including ``randint(-delta, delta)`` excluding ``+delta``, which with the bottom-right to
  top-left sweep lets bright pixels drift up-left; CIFAR-10-C's glass blur is severe even at
  severity 1 for this reason) but stepped for the whole batch at once; the image is not
  rounded to uint8 between the two Gaussian blurs.
* ``zoom_blur`` / geometric corruptions: bilinear resampling about the image centre with edge
  pixels repeated (on MNIST's zero margin the same as MNIST-C's zero fill).
* ``pixelate``: PIL's BOX resize down to ``int(size * c)`` (mean of the pixels whose centres
  fall in each output pixel) and back up (nearest), as matrices, without PIL's uint8 rounding
  of the small image.
* ``brightness`` / ``saturate``: HSV value and saturation edits as in the references;
  brightness uses the exact identity that, at fixed hue and saturation, RGB scales with V
  (on grayscale it is simply ``x + c``). ``saturate`` needs colour and rejects grayscale
  (MNIST-C's saturate on gray images is the identity up to rounding).
* Not included: ``snow``, ``frost`` (needs the reference's frost photographs) and ``spatter``
  (OpenCV-specific edge/distance transforms), MNIST-C's ``stripe``, ``line``,
  ``dotted_line``, ``zigzag``, ``inverse``, ``canny_edges`` and ``pessimal_noise`` (single
  severity or a stored noise matrix).

Modules
-------
:mod:`.registry` (the tables, :func:`corrupt`, :func:`apply_corruption`), one module per family
(:mod:`.noise`, :mod:`.blur`, :mod:`.weather`, :mod:`.digital`, :mod:`.geometric`), the shared
:mod:`.batch` (input checks, per-image generators) and :mod:`.resample` (warps about the
centre), and :mod:`.preview` (:func:`preview_grid`).
"""

from .registry import (
    CORRUPTIONS,
    DEFAULT_TABLE,
    ELASTIC_SIGMA,
    PMT_MNIST,
    SEVERITIES,
    TABLES,
    Corruption,
    apply_corruption,
    corrupt,
    list_corruptions,
    severity_params,
)
from .preview import preview_grid

__all__ = [
    "CORRUPTIONS",
    "DEFAULT_TABLE",
    "ELASTIC_SIGMA",
    "PMT_MNIST",
    "apply_corruption",
    "SEVERITIES",
    "TABLES",
    "Corruption",
    "corrupt",
    "list_corruptions",
    "preview_grid",
    "severity_params",
]

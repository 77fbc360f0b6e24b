"""The repository's Dockerfile, built and run without a Docker engine (issue 16).

``setup.sh`` installs buildah and mmdebstrap and calls ``build.sh``, which builds the image on
a locally made Debian base (cached); `harness.image.buildah` runs commands in it.
"""

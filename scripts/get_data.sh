#!/usr/bin/env bash
# Installs the offline Fashion-MNIST (Debian package dataset-fashion-mnist) where
# apt and root are available; elsewhere the pipeline falls back to TFDS download.
set -uo pipefail
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  exit 0
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist \
    && exit 0
  echo "apt-get could not install dataset-fashion-mnist; TFDS will download fashion_mnist." >&2
else
  echo "No apt-get as root here; TFDS will download fashion_mnist on first use." >&2
fi

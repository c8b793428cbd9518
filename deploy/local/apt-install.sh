# Sourced by the install-*.sh scripts `make test` runs: installs one Debian package when what a
# test needs from it is missing, or stops with the command to run.
#
#   apt_install PACKAGE WHAT
#
# PACKAGE: the Debian package; WHAT: what is missing, for the messages.

apt_install() {
  local package=$1 what=$2
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "make test: $what is missing and this machine has no apt-get;" \
         "install Debian's $package (or its equivalent) and run make test again" >&2
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "make test: $what is missing; install it as root:" \
         "sudo apt-get update && sudo apt-get install -y $package, then run make test again" >&2
    exit 1
  fi
  echo "make test: installing Debian's $package ($what) ..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "$package" >/dev/null
}

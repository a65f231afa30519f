# tls.sh: the trust a package index's certificate is checked with, the same for the build (env.sh)
# and for the check (facts.sh), which both begin with it. Behind a company proxy that inspects TLS
# the index's certificate comes from a private CA the machine trusts, not from the public roots uv
# carries. rc_tls CA_BUNDLE exports, in the shell it runs in:
#   SSL_CERT_FILE  the machine option index_ca_bundle (CA_BUNDLE) if given; else the far side's own
#                  SSL_CERT_FILE as it is; else pip's configured cert (PIP_CERT, pip.conf's cert =)
#   PIP_CERT       the same file, for a build with venv + pip
# and sets rc_tls_system=1 where the machine has a store of its own for uv's system certificates.
rc_tls_pip_cert() {
  if [ -n "${PIP_CERT-}" ]; then printf '%s\n' "$PIP_CERT"; return; fi
  found=
  # pip's own order: the later file wins
  for f in /etc/xdg/pip/pip.conf /etc/pip.conf "${HOME-}/.pip/pip.conf" \
    "${XDG_CONFIG_HOME:-${HOME-}/.config}/pip/pip.conf" ${PIP_CONFIG_FILE:+"$PIP_CONFIG_FILE"}; do
    [ -r "$f" ] || continue
    c=$(sed -n 's/^[[:space:]]*cert[[:space:]]*[=:][[:space:]]*//p' "$f" | tail -n 1)
    [ -z "$c" ] || found=$c
  done
  printf '%s\n' "$found"
}
rc_tls() { # CA_BUNDLE
  if [ -n "${1-}" ]; then
    SSL_CERT_FILE=$1
  elif [ -z "${SSL_CERT_FILE-}" ]; then
    c=$(rc_tls_pip_cert)
    [ -z "$c" ] || [ ! -r "$c" ] || SSL_CERT_FILE=$c
  fi
  if [ -n "${SSL_CERT_FILE-}" ]; then
    PIP_CERT=$SSL_CERT_FILE
    export SSL_CERT_FILE PIP_CERT
  fi
  # A store uv can read: a bundle where the distributions keep one, the settings naming one, macOS.
  rc_tls_system=
  for f in "${SSL_CERT_FILE-}" "${SSL_CERT_DIR-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt \
    /etc/ssl/ca-bundle.pem /etc/pki/tls/cacert.pem /etc/ssl/cert.pem; do
    [ -n "$f" ] && [ -r "$f" ] && { rc_tls_system=1; break; }
  done
  [ "$(uname -s)" != Darwin ] || rc_tls_system=1
}

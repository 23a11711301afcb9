//! How the PostgreSQL connection is secured, from the URL's `sslmode` in libpq's words:
//! none given or `disable`, a plain connection; `prefer` and `require`, TLS without checking
//! the server's certificate (as libpq does without a root certificate); `verify-full`, TLS
//! with the certificate checked against `sslrootcert` (a PEM file) or Mozilla's roots, and
//! the host name against the certificate. `verify-ca` is refused rather than weakened.

use crate::store::StoreError;
use postgres::{Client, NoTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The security a URL asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    /// TLS, the certificate not checked (`prefer` falls back to plain when the server
    /// offers no TLS, `require` does not).
    Encrypted,
    /// TLS with the certificate and host name checked, against this PEM file's
    /// certificates or, without one, Mozilla's roots.
    Verified {
        root: Option<String>,
    },
}

/// The URL tokio-postgres is given (its `sslmode` one it knows, `sslrootcert` taken out)
/// and the security asked for.
fn parse(url: &str) -> Result<(String, Mode), StoreError> {
    let bad = |m: String| StoreError::Schema(format!("database URL: {m}"));
    let (keep, pairs): (Vec<String>, Vec<(String, String)>) = if url.contains("://") {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut keep = Vec::new();
        let mut pairs = Vec::new();
        for p in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match k {
                "sslmode" | "sslrootcert" => pairs.push((k.to_string(), v.to_string())),
                _ => keep.push(p.to_string()),
            }
        }
        (vec![base.to_string(), keep.join("&")], pairs)
    } else {
        let mut keep = Vec::new();
        let mut pairs = Vec::new();
        for p in url.split_whitespace() {
            match p.split_once('=') {
                Some((k @ ("sslmode" | "sslrootcert"), v)) => {
                    pairs.push((k.to_string(), v.to_string()))
                }
                _ => keep.push(p.to_string()),
            }
        }
        (vec![keep.join(" ")], pairs)
    };
    let find = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let root = find("sslrootcert");
    let (mode, pg_mode) = match find("sslmode").as_deref() {
        None | Some("disable") => (Mode::Plain, None),
        Some("prefer") => (Mode::Encrypted, Some("prefer")),
        Some("require") => (Mode::Encrypted, Some("require")),
        Some("verify-full") => (Mode::Verified { root: root.clone() }, Some("require")),
        Some("verify-ca") => return Err(bad(
            "sslmode=verify-ca is not supported: use verify-full (which checks the host name too)"
                .into(),
        )),
        Some(other) => return Err(bad(format!("unknown sslmode {other:?}"))),
    };
    if root.is_some() && !matches!(mode, Mode::Verified { .. }) {
        return Err(bad("sslrootcert needs sslmode=verify-full".into()));
    }
    let rebuilt = if url.contains("://") {
        let mut query: Vec<String> = keep[1]
            .split('&')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect();
        query.extend(pg_mode.map(|m| format!("sslmode={m}")));
        if query.is_empty() {
            keep[0].clone()
        } else {
            format!("{}?{}", keep[0], query.join("&"))
        }
    } else {
        let mut s = keep[0].clone();
        if let Some(m) = pg_mode {
            s.push_str(&format!(" sslmode={m}"));
        }
        s
    };
    Ok((rebuilt, mode))
}

/// Connects to `url` with the security it asks for.
pub(super) fn connect(url: &str) -> Result<Client, StoreError> {
    let (url, mode) = parse(url)?;
    let provider = Arc::new(ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Schema(format!("TLS: {e}")))?;
    let config = match mode {
        Mode::Plain => return Ok(Client::connect(&url, NoTls)?),
        Mode::Encrypted => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth(),
        Mode::Verified { root } => {
            let mut roots = RootCertStore::empty();
            match root {
                Some(path) => {
                    let certs = CertificateDer::pem_file_iter(&path)
                        .map_err(|e| StoreError::Schema(format!("sslrootcert {path}: {e}")))?;
                    for cert in certs {
                        let cert = cert
                            .map_err(|e| StoreError::Schema(format!("sslrootcert {path}: {e}")))?;
                        roots
                            .add(cert)
                            .map_err(|e| StoreError::Schema(format!("sslrootcert {path}: {e}")))?;
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Client::connect(&url, MakeRustlsConnect::new(config)).map_err(|e| {
        // "error performing TLS handshake" alone does not say what was wrong with it.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        StoreError::Unavailable(message)
    })
}

/// `prefer` and `require`: encrypted, the certificate taken as it is (libpq's meaning).
/// The handshake's signatures are still checked, so the session is the certificate's key's.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_read_in_libpq_words_and_given_to_tokio_postgres_in_its_own() {
        let url = "postgres://u:p@h/db";
        assert_eq!(parse(url).unwrap(), (url.to_string(), Mode::Plain));
        assert_eq!(
            parse("postgres://u@h/db?sslmode=require&application_name=t").unwrap(),
            (
                "postgres://u@h/db?application_name=t&sslmode=require".to_string(),
                Mode::Encrypted
            )
        );
        assert_eq!(
            parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem").unwrap(),
            (
                "postgres://u@h/db?sslmode=require".to_string(),
                Mode::Verified {
                    root: Some("/ca.pem".into())
                }
            )
        );
        assert_eq!(
            parse("host=h user=u sslmode=verify-full").unwrap(),
            (
                "host=h user=u sslmode=require".to_string(),
                Mode::Verified { root: None }
            )
        );
        assert_eq!(
            parse("postgres://u@h/db?sslmode=disable").unwrap().1,
            Mode::Plain
        );
        for bad in [
            "postgres://h/db?sslmode=verify-ca",
            "postgres://h/db?sslmode=maybe",
            "postgres://h/db?sslrootcert=/ca.pem",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

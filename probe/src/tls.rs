//! The TLS client of HTTPS probes: rustls on ring, certificates not verified.

use std::{
    net::IpAddr,
    sync::{Arc, LazyLock},
};

use rustls::{
    ClientConfig, DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, ring},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

use super::Fail;

static CONFIG: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| {
    let provider = Arc::new(ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    // What the probe speaks: servers that negotiate ALPN must not pick h2.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
});

/// A TLS handshake over `stream`, with SNI `host` when it is a DNS name (a port on it is
/// ignored), else no SNI (the name is the backend's address).
pub(super) async fn connect(stream: TcpStream, host: Option<&str>, ip: IpAddr) -> Result<TlsStream<TcpStream>, Fail> {
    let name = host.and_then(dns_name).unwrap_or(ServerName::IpAddress(ip.into()));
    TlsConnector::from(CONFIG.clone())
        .connect(name, stream)
        .await
        .map_err(|e| if e.raw_os_error().is_some() { Fail::Io(e) } else { Fail::backend("tls_handshake") })
}

fn dns_name(host: &str) -> Option<ServerName<'static>> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        _ => host,
    };
    match ServerName::try_from(name.to_owned()) {
        Ok(name @ ServerName::DnsName(_)) => Some(name),
        _ => None,
    }
}

/// Accepts any certificate. A health check asks whether the service on this address answers;
/// a backend's certificate names the service (what clients connect to), not the backend's
/// address, so it cannot be verified against what is probed, and verifying it is the clients'
/// business on their own connections. The handshake's signatures are still checked, so a
/// broken TLS stack on the backend fails its probe.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_is_the_host_only_when_it_is_a_dns_name() {
        let dns = |name: &str| Some(ServerName::try_from(name.to_owned()).unwrap());
        assert_eq!(dns_name("svc.example"), dns("svc.example"));
        assert_eq!(dns_name("svc.example:8443"), dns("svc.example"));
        assert_eq!(dns_name("10.0.0.1"), None);
        assert_eq!(dns_name("10.0.0.1:443"), None);
        assert_eq!(dns_name("[::1]:443"), None);
    }
}

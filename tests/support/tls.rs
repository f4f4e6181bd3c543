//! Certificates for the TLS tests, made fresh by each test binary (rcgen): a CA, a server
//! certificate for `localhost` and `127.0.0.1` signed by it, a client certificate signed by
//! it, and the bad cases: another CA, a server certificate for another name, an expired one.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose,
    date_time_ymd,
};

use super::{RedisCluster, RedisServer, Sentinels};

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

/// Every certificate the tests use, and the files redis-server reads.
pub struct Pki {
    pub ca: String,
    pub other_ca: String,
    pub server: Pair,
    pub client: Pair,
    pub wrong_name: Pair,
    pub expired: Pair,
    /// A client certificate from the other CA, which the servers do not trust.
    pub stranger: Pair,
    pub dir: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    names: &[&str],
    issuer: &CertifiedIssuer<'static, KeyPair>,
    edit: impl FnOnce(&mut CertificateParams),
) -> Pair {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    edit(&mut params);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

impl Pki {
    pub fn new() -> Pki {
        let root = ca("tower-ratelimit test CA");
        let other = ca("another CA");
        let names = ["localhost", "127.0.0.1"];
        let server = leaf(&names, &root, |_| {});
        let client = leaf(&["client"], &root, |_| {});
        let wrong_name = leaf(&["other.example"], &root, |_| {});
        let expired = leaf(&names, &root, |p| {
            p.not_before = date_time_ymd(2001, 1, 1);
            p.not_after = date_time_ymd(2002, 1, 1);
        });
        let stranger = leaf(&["client"], &other, |_| {});
        let dir = std::env::temp_dir().join(format!(
            "tower-ratelimit-pki-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki {
            ca: root.pem(),
            other_ca: other.pem(),
            server,
            client,
            wrong_name,
            expired,
            stranger,
            dir,
        };
        pki.write("ca.crt", &pki.ca);
        for (name, pair) in [
            ("server", &pki.server),
            ("client", &pki.client),
            ("wrong_name", &pki.wrong_name),
            ("expired", &pki.expired),
        ] {
            pki.write(&format!("{name}.crt"), &pair.cert);
            pki.write(&format!("{name}.key"), &pair.key);
        }
        pki
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.join(name), text).unwrap();
    }

    /// The path of a file written by [`Pki::new`].
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    /// redis-server's TLS options, presenting the certificate `server` (`server`,
    /// `wrong_name` or `expired`) and asking clients for one when `mutual`.
    pub fn server_args(&self, server: &str, mutual: bool) -> Vec<String> {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        [
            ("--tls-cert-file", self.path(&format!("{server}.crt"))),
            ("--tls-key-file", self.path(&format!("{server}.key"))),
            ("--tls-ca-cert-file", self.path("ca.crt")),
            ("--tls-auth-clients", yes_no(mutual).to_owned()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }

    /// What redis-cli needs to reach a server of [`Pki::server_args`] (without checking its
    /// certificate: the harness also runs the servers with bad ones).
    pub fn cli_args(&self) -> Vec<String> {
        [
            "--tls",
            "--insecure",
            "--cert",
            &self.path("client.crt"),
            "--key",
            &self.path("client.key"),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The client's side: this CA, and the client certificate.
    pub fn client_tls(&self) -> tower_ratelimit::RedisTls {
        tower_ratelimit::RedisTls::new()
            .ca_pem(self.ca.clone())
            .client_certificate(self.client.cert.clone(), self.client.key.clone())
    }

    /// A standalone server on a TLS port only, presenting `server`'s certificate.
    pub fn server(&self, server: &str, mutual: bool, extra: &[&str]) -> RedisServer {
        let mut args = self.server_args(server, mutual);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        RedisServer::start_as(&args, &self.cli_args(), true)
    }

    /// A cluster of three TLS-only primaries that speak TLS to each other, asking clients for
    /// a certificate.
    pub fn cluster(&self) -> RedisCluster {
        let mut args = self.server_args("server", true);
        args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        RedisCluster::start_as(&args, &self.cli_args(), true)
    }

    /// A primary, a replica and three sentinels, all TLS-only, asking clients for a
    /// certificate.
    pub fn sentinels(&self) -> Sentinels {
        let mut args = self.server_args("server", true);
        args.extend(["--tls-replication", "yes"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Sentinels::start_as(&args, &self.cli_args(), true)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

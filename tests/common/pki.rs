//! Certificates made with the `openssl` command for TLS tests: self-signed CAs and leaves they
//! sign, in a scratch directory removed when dropped.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `openssl` with `args` in `dir`.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A scratch directory of certificates: CAs, and leaves signed by them.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("weir-pki-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pki dir");
        Pki { dir }
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).expect("read pem")
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// A self-signed CA: `<name>.pem`, `<name>.key`.
    pub fn ca(&self, name: &str) {
        let (pem, key, subj) = (format!("{name}.pem"), format!("{name}.key"), format!("/CN={name}"));
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &pem,
                "-days",
                "30",
                "-subj",
                &subj,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    /// A certificate `<name>.pem`/`<name>.key` for `subj`, signed by CA `ca`, with `ext`
    /// (OpenSSL extension lines).
    pub fn leaf(&self, name: &str, ca: &str, subj: &str, ext: &str) {
        let (pem, key, csr, extfile) =
            (format!("{name}.pem"), format!("{name}.key"), format!("{name}.csr"), format!("{name}.ext"));
        std::fs::write(self.dir.join(&extfile), ext).expect("write ext");
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                subj,
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "30",
                "-extfile",
                &extfile,
            ],
        );
    }

    /// The SHA-1 fingerprint of `<name>.pem`, as `$ssl_client_fingerprint` writes it.
    pub fn fingerprint(&self, name: &str) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha1", "-in", &format!("{name}.pem")])
            .current_dir(&self.dir)
            .output()
            .expect("openssl fingerprint");
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().rsplit('=').next().unwrap_or("").replace(':', "").to_ascii_lowercase()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// YAML of a PEM text, as a block scalar indented for `key:` at `indent` spaces.
pub fn yaml_block(pem: &str, indent: usize) -> String {
    let pad = " ".repeat(indent + 2);
    let lines: Vec<String> = pem.trim_end().lines().map(|l| format!("{pad}{l}")).collect();
    format!("|\n{}", lines.join("\n"))
}

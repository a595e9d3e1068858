//! Tokens: a client identity for programs that cannot hold a certificate.
//!
//! A token names a user, a role, an expiry and an id, signed with the cluster CA's key
//! (`hawser cert create-token`). A node checks it with the CA's certificate it already
//! has: no secret is shared with the nodes, and only the holder of `ca.key` can make
//! one, as with client certificates.
//!
//! ```text
//!  hawser1.<base64url "user:role:expires-unix-seconds:id">.<base64url ECDSA P-256 signature>
//! ```
//!
//! A token travels as `authorization: Bearer <token>` over a TLS connection that
//! shows no client certificate. It is refused once expired, or once its id is listed
//! in `revoked-tokens` in the node's certificates directory (one id per line, `#`
//! comments; re-read when the file changes).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};

use crate::{check_name, file_error, read, Role, TlsError, CA_CERT};

/// The prefix of every token: its format's version.
const PREFIX: &str = "hawser1.";
/// The file of revoked token ids, in a node's certificates directory.
pub const REVOKED_TOKENS: &str = "revoked-tokens";
/// Tokens checked and remembered at once; past it the memory starts over.
const CACHE_ENTRIES: usize = 4096;
/// How often the revocation file's modification time is looked at, at most.
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// What a token says, once its signature is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub role: Role,
    /// Seconds since the Unix epoch after which it is refused.
    pub expires: u64,
    /// What `revoked-tokens` names it by.
    pub id: String,
}

impl Claims {
    fn payload(&self) -> String {
        format!("{}:{}:{}:{}", self.user, self.role, self.expires, self.id)
    }

    fn parse(payload: &str) -> Result<Claims, TlsError> {
        let bad = || TlsError::Invalid("the token's claims are not user:role:expires:id".into());
        let mut parts = payload.split(':');
        let (Some(user), Some(role), Some(expires), Some(id), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        Ok(Claims {
            user: user.to_string(),
            role: role.parse()?,
            expires: expires.parse().map_err(|_| bad())?,
            id: id.to_string(),
        })
    }
}

/// Makes a token for `user` with `role`, valid for `lifetime`, signed with the CA key
/// in PEM `ca_key_pem`. Returns the token and its claims.
pub fn sign(
    ca_key_pem: &str,
    ca_key_path: &Path,
    user: &str,
    role: Role,
    lifetime: Duration,
) -> Result<(String, Claims), TlsError> {
    use rcgen::SigningKey as _;
    check_name(user, "user")?;
    if lifetime.is_zero() {
        return Err(TlsError::Invalid("a token lifetime of 0".into()));
    }
    let key = rcgen::KeyPair::from_pem(ca_key_pem)
        .map_err(|e| file_error(ca_key_path, format!("not a private key: {e}")))?;
    if key.algorithm() != &rcgen::PKCS_ECDSA_P256_SHA256 {
        return Err(file_error(
            ca_key_path,
            "tokens are signed with an ECDSA P-256 CA key, as `hawser cert create-ca` makes; \
             this one is another kind",
        ));
    }
    let mut id = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id)
        .map_err(|_| TlsError::Invalid("no randomness for the token's id".into()))?;
    let claims = Claims {
        user: user.to_string(),
        role,
        expires: unix_now().saturating_add(lifetime.as_secs().max(1)),
        id: id.iter().map(|b| format!("{b:02x}")).collect(),
    };
    let payload = claims.payload();
    let signature = key
        .sign(payload.as_bytes())
        .map_err(|e| TlsError::Invalid(format!("cannot sign the token: {e}")))?;
    let token = format!(
        "{PREFIX}{}.{}",
        URL_SAFE_NO_PAD.encode(payload),
        URL_SAFE_NO_PAD.encode(signature)
    );
    Ok((token, claims))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks tokens against one CA: signature, expiry, revocation. Remembers the tokens
/// whose signature it checked, so a client's every call costs a map lookup.
#[derive(Debug)]
pub struct Tokens {
    key: UnparsedPublicKey<Vec<u8>>,
    revoked_path: PathBuf,
    revoked: Mutex<Revoked>,
    checked: Mutex<HashMap<String, Claims>>,
}

#[derive(Debug, Default)]
struct Revoked {
    ids: HashSet<String>,
    modified: Option<SystemTime>,
    looked: Option<std::time::Instant>,
}

impl Tokens {
    /// Checks tokens signed by the CA of `certs_dir`'s `ca.crt`, revoked by its
    /// `revoked-tokens`.
    pub fn load(certs_dir: &Path) -> Result<Tokens, TlsError> {
        let ca_path = certs_dir.join(CA_CERT);
        let pem = read(&ca_path, "CA certificate")?;
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| file_error(&ca_path, format!("not a PEM certificate: {e}")))?;
        let cert = block
            .parse_x509()
            .map_err(|e| file_error(&ca_path, format!("not an X.509 certificate: {e}")))?;
        let key = cert.public_key().subject_public_key.data.to_vec();
        let tokens = Tokens {
            key: UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, key),
            revoked_path: certs_dir.join(REVOKED_TOKENS),
            revoked: Mutex::default(),
            checked: Mutex::default(),
        };
        tokens.refresh_revoked(true)?;
        Ok(tokens)
    }

    /// Who `token` names, if it is one of this CA's, unexpired and not revoked.
    pub fn check(&self, token: &str) -> Result<Claims, TlsError> {
        let remembered = self
            .checked
            .lock()
            .expect("not poisoned")
            .get(token)
            .cloned();
        let claims = match remembered {
            Some(c) => c,
            None => {
                let c = self.verify(token)?;
                let mut checked = self.checked.lock().expect("not poisoned");
                if checked.len() >= CACHE_ENTRIES {
                    checked.clear();
                }
                checked.insert(token.to_string(), c.clone());
                c
            }
        };
        if unix_now() >= claims.expires {
            return Err(TlsError::Invalid(format!(
                "the token of {} (id {}) has expired; make a new one with `hawser cert create-token`",
                claims.user, claims.id
            )));
        }
        // A revocation file that cannot be read keeps the last list it had: a node
        // does not start letting revoked tokens in because a file went missing.
        let _ = self.refresh_revoked(false);
        if self
            .revoked
            .lock()
            .expect("not poisoned")
            .ids
            .contains(&claims.id)
        {
            return Err(TlsError::Invalid(format!(
                "the token of {} (id {}) is revoked ({})",
                claims.user,
                claims.id,
                self.revoked_path.display()
            )));
        }
        Ok(claims)
    }

    fn verify(&self, token: &str) -> Result<Claims, TlsError> {
        let not_ours =
            || TlsError::Invalid("not a hawser token (hawser1.<claims>.<signature>)".into());
        let rest = token.strip_prefix(PREFIX).ok_or_else(not_ours)?;
        let (payload, signature) = rest.split_once('.').ok_or_else(not_ours)?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| not_ours())?;
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| not_ours())?;
        self.key.verify(&payload, &signature).map_err(|_| {
            TlsError::Invalid("the token's signature is not of this cluster's CA".into())
        })?;
        let payload = String::from_utf8(payload).map_err(|_| not_ours())?;
        Claims::parse(&payload)
    }

    /// Re-reads `revoked-tokens` when it changed (at most once a second unless `now`).
    fn refresh_revoked(&self, force: bool) -> Result<(), TlsError> {
        let mut revoked = self.revoked.lock().expect("not poisoned");
        let due = revoked
            .looked
            .is_none_or(|t| t.elapsed() >= REVOCATION_CHECK);
        if !force && !due {
            return Ok(());
        }
        revoked.looked = Some(std::time::Instant::now());
        let modified = match std::fs::metadata(&self.revoked_path) {
            Ok(m) => m.modified().ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                revoked.ids.clear();
                revoked.modified = None;
                return Ok(());
            }
            Err(e) => return Err(file_error(&self.revoked_path, format!("cannot read: {e}"))),
        };
        if !force && modified.is_some() && modified == revoked.modified {
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.revoked_path)
            .map_err(|e| file_error(&self.revoked_path, format!("cannot read: {e}")))?;
        revoked.ids = revoked_ids(&text);
        revoked.modified = modified;
        Ok(())
    }
}

/// The ids a revocation file lists: one per line, blank lines and `#` comments aside.
fn revoked_ids(text: &str) -> HashSet<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Issue, CA_KEY};

    fn ca(dir: &Path) -> String {
        Issue {
            certs_dir: dir.to_path_buf(),
            ca_key: dir.join(CA_KEY),
            days: 1,
            overwrite: false,
        }
        .create_ca()
        .unwrap();
        std::fs::read_to_string(dir.join(CA_KEY)).unwrap()
    }

    #[test]
    fn a_token_names_its_user_and_role_to_a_node_of_the_same_ca() {
        let dir = tempfile::tempdir().unwrap();
        let key = ca(dir.path());
        let (token, claims) = sign(
            &key,
            Path::new("ca.key"),
            "ann",
            Role::Writer,
            Duration::from_secs(3600),
        )
        .unwrap();
        assert!(token.starts_with(PREFIX), "{token}");
        let tokens = Tokens::load(dir.path()).unwrap();
        let got = tokens.check(&token).unwrap();
        assert_eq!(got, claims);
        assert_eq!((got.user.as_str(), got.role), ("ann", Role::Writer));
        // Remembered: the second check is the same answer.
        assert_eq!(tokens.check(&token).unwrap(), claims);
    }

    #[test]
    fn tokens_of_another_ca_altered_or_malformed_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        ca(dir.path());
        let other = tempfile::tempdir().unwrap();
        let other_key = ca(other.path());
        let tokens = Tokens::load(dir.path()).unwrap();
        let (foreign, _) = sign(
            &other_key,
            Path::new("k"),
            "ann",
            Role::Admin,
            Duration::from_secs(60),
        )
        .unwrap();
        let err = tokens.check(&foreign).unwrap_err().to_string();
        assert!(err.contains("not of this cluster's CA"), "{err}");

        // The claims changed from reader to admin, the signature kept.
        let key = std::fs::read_to_string(dir.path().join(CA_KEY)).unwrap();
        let (token, claims) = sign(
            &key,
            Path::new("k"),
            "rex",
            Role::Reader,
            Duration::from_secs(60),
        )
        .unwrap();
        let signature = token.rsplit('.').next().unwrap();
        let forged = format!(
            "{PREFIX}{}.{signature}",
            URL_SAFE_NO_PAD.encode(
                Claims {
                    role: Role::Admin,
                    ..claims
                }
                .payload()
            )
        );
        assert!(tokens.check(&forged).is_err());
        for junk in ["", "hawser1.", "hawser1.a.b", "Bearer x", "hawser1.%%%.%%%"] {
            let err = tokens.check(junk).unwrap_err().to_string();
            assert!(
                err.contains("not a hawser token") || err.contains("signature"),
                "{junk}: {err}"
            );
        }
    }

    #[test]
    fn expired_and_revoked_tokens_are_refused_and_a_revocation_is_seen_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let key = ca(dir.path());
        let tokens = Tokens::load(dir.path()).unwrap();
        // Expired: signed claims whose time has passed.
        let (token, claims) = sign(
            &key,
            Path::new("k"),
            "old",
            Role::Reader,
            Duration::from_secs(1),
        )
        .unwrap();
        let expired = Claims {
            expires: unix_now() - 10,
            ..claims
        };
        let signature = {
            use rcgen::SigningKey as _;
            rcgen::KeyPair::from_pem(&key)
                .unwrap()
                .sign(expired.payload().as_bytes())
                .unwrap()
        };
        let expired_token = format!(
            "{PREFIX}{}.{}",
            URL_SAFE_NO_PAD.encode(expired.payload()),
            URL_SAFE_NO_PAD.encode(signature)
        );
        let err = tokens.check(&expired_token).unwrap_err().to_string();
        assert!(err.contains("expired"), "{err}");
        drop(token);

        let (token, claims) = sign(
            &key,
            Path::new("k"),
            "ann",
            Role::Writer,
            Duration::from_secs(3600),
        )
        .unwrap();
        assert!(tokens.check(&token).is_ok());
        std::fs::write(
            dir.path().join(REVOKED_TOKENS),
            format!("# left the company\n{}  # ann\n", claims.id),
        )
        .unwrap();
        // Seen within the re-read interval, without a new Tokens.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokens.check(&token) {
                Err(e) => {
                    assert!(e.to_string().contains("revoked"), "{e}");
                    break;
                }
                Ok(_) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "revocation never seen"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    #[test]
    fn a_revocation_file_lists_ids_one_per_line_with_comments() {
        let ids = revoked_ids("# header\n\nabc\n  def  # why\n#ghi\n");
        assert_eq!(ids, HashSet::from(["abc".to_string(), "def".to_string()]));
    }

    #[test]
    fn claims_round_trip_and_malformed_claims_are_refused() {
        let c = Claims {
            user: "ann".into(),
            role: Role::Reader,
            expires: 42,
            id: "00ff".into(),
        };
        assert_eq!(Claims::parse(&c.payload()).unwrap(), c);
        for bad in [
            "",
            "a:b",
            "ann:reader:x:1",
            "ann:god:1:1",
            "a:reader:1:1:extra",
        ] {
            assert!(Claims::parse(bad).is_err(), "{bad}");
        }
    }
}

//! What serve trusts and keeps trusted: the signing keyring in its Secret
//! (`signing`), the rule every later version of a guarded Secret is judged
//! by (`guarded`), serve's own CA and serving certificate (`certificates`,
//! `own_certificate`: open these to change how the certificate rotates),
//! and the webhook configuration kept on the door's path and the CA
//! (`registration`).
//!
//! The highest wing: it uses `intake` (the door, the listener's TLS),
//! `answer` (the state it marks registered), `work` (who leads) and `tell`.

pub mod certificates;
pub(crate) mod guarded;
pub(crate) mod own_certificate;
pub(crate) mod registration;
pub mod signing;

//! The vocabulary: sources and snapshots, the kinds and their references,
//! the annotations a workload opts in with (and a source's word about its
//! readers), the records the policy keeps, the settings. Below everything else; it asks no host anything.

pub mod approval;
pub mod content;
pub mod duration;
pub mod keys;
pub mod kinds;
pub mod object;
pub mod optin;
pub mod readers;
pub mod records;
pub mod references;
pub mod request;
pub mod revocation;
pub mod selection;
pub mod settings;
pub mod source;
pub mod template;
pub mod window;

//! How serve reads an admission's sources ahead of the policy: the mode
//! (`serve --source-reads`) and the limits every read ahead is held to.
//! The reads themselves are `prefetch`'s; the API calls `apiserver`'s.

/// How an admission's fresh source reads are made ahead of the policy
/// (`serve --source-reads`; docs/BENCHMARKS.md, "Fresh reads", measures
/// each on the real control plane). Every way is as fresh as the request:
/// each read starts after it arrived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceReads {
    /// A GET per source and per snapshot, all at once.
    #[default]
    Parallel,
    /// The same GETs, one after another: one kept-alive connection.
    Sequential,
    /// One consistent LIST per kind of the namespace, when serve's cache
    /// shows it small; GETs otherwise.
    List,
    /// None ahead: the policy's reads go to the API server as it makes them.
    None,
}

/// The most objects a LIST ahead may bring, and the most serve's cache may
/// show of the kind in the namespace for one to be made: past it, the
/// listing would cost more than the GETs it saves.
pub(crate) const LIST_AT_MOST: u32 = 32;

/// Reads ahead one admission runs at once (but one, reading sequentially).
const PER_ADMISSION: usize = 8;

impl SourceReads {
    /// How many of one admission's reads ahead run at once in this mode.
    pub(crate) fn at_once(self) -> usize {
        match self {
            SourceReads::Sequential => 1,
            _ => PER_ADMISSION,
        }
    }
}

/// Reads ahead all admissions run at once.
pub(crate) const IN_FLIGHT: usize = 64;

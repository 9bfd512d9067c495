pub mod apiserver;
pub mod process;

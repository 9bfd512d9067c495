pub mod connections;
pub mod paths;
pub mod process;
pub mod webhook;

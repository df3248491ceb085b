//! Größe: multi-byte text first.
use std::fmt;

pub const LIMIT: usize = 10;

#[derive(Debug)]
pub struct Config {
    pub name: String,
}

pub enum Mode { Fast, Slow }

pub trait Speak {
    fn speak(&self) -> String;
}

impl Config {
    pub fn new(name: &str) -> Self {
        Config { name: name.to_string() }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "héllo {}", self.name)
    }
}

pub fn run_turn(c: &Config) -> String {
    format!("{}", c)
}

macro_rules! twice { ($e:expr) => { $e; $e }; }

mod inner {
    pub fn helper() {}
}

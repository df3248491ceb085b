//! Turn counting (Zählung der Züge).

pub struct Agent {
    pub turns: u32,
}

impl Agent {
    pub fn new() -> Self {
        Agent { turns: 0 }
    }

    pub fn run_turn(&mut self) -> u32 {
        self.turns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_turns() {
        let mut a = Agent::new();
        a.run_turn();
        assert_eq!(a.run_turn(), 2);
    }
}

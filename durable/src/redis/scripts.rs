//! The queue's Lua scripts, one per file in `scripts/`. Each file opens with a header that
//! states its KEYS, its ARGV, its reply and the invariant it keeps; read it there.
//!
//! A script is sent as `scripts/prelude.lua` (the functions every script shares: the
//! server's clock, the task record, targeted wake-ups) followed by its own file, so each runs
//! as one atomic step on the partition's node.

use redis::Script;

/// A script as it is sent: the shared prelude, then the script's own file.
macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("scripts/prelude.lua"),
            include_str!(concat!("scripts/", $file))
        ))
    };
}

/// Every script of a queue, loaded by the server on first use (`EVALSHA`, then `SCRIPT
/// LOAD` on `NOSCRIPT`).
pub(super) struct Scripts {
    /// Makes or replaces one task (`schedule.lua`).
    pub(super) schedule: Script,
    /// Expires leases and hands out due tasks with their payloads (`claim.lua`).
    pub(super) claim: Script,
    /// Acks, retries or kills one delivery (`finish.lua`).
    pub(super) finish: Script,
    /// Renews or sets leases (`extend.lua`).
    pub(super) extend: Script,
    /// Returns claims never handed out (`release.lua`).
    pub(super) release: Script,
    /// Cancels, reschedules, redrives or removes a recurring schedule (`change.lua`).
    pub(super) change: Script,
    /// Declares a recurring schedule (`schedule_recurring.lua`).
    pub(super) schedule_recurring: Script,
    /// Makes a claimed schedule's owed occurrences and moves it on (`advance.lua`).
    pub(super) advance: Script,
    /// One page of an index (`list.lua`).
    pub(super) list: Script,
    /// Deletes a batch of old dead letters (`purge.lua`).
    pub(super) purge: Script,
    /// One task's record (`get.lua`).
    pub(super) get: Script,
    /// A partition's counts and counters (`stats.lua`).
    pub(super) stats: Script,
    /// One task's payload (`payload.lua`).
    pub(super) payload: Script,
    /// The reply an erred finish invocation kept (`kept_reply.lua`).
    pub(super) kept_reply: Script,
    /// Pauses or resumes claiming on a partition (`pause.lua`).
    pub(super) pause: Script,
    /// The server's clock on a partition's node (`time.lua`).
    pub(super) time: Script,
}

impl Scripts {
    pub(super) fn load() -> Scripts {
        Scripts {
            schedule: script!("schedule.lua"),
            claim: script!("claim.lua"),
            finish: script!("finish.lua"),
            extend: script!("extend.lua"),
            release: script!("release.lua"),
            change: script!("change.lua"),
            schedule_recurring: script!("schedule_recurring.lua"),
            advance: script!("advance.lua"),
            list: script!("list.lua"),
            purge: script!("purge.lua"),
            get: script!("get.lua"),
            stats: script!("stats.lua"),
            payload: script!("payload.lua"),
            kept_reply: script!("kept_reply.lua"),
            pause: script!("pause.lua"),
            time: script!("time.lua"),
        }
    }
}

impl Scripts {
    /// Whether `script` only reads (what a read-only handle may run).
    pub(super) fn reads_only(&self, script: &Script) -> bool {
        [&self.get, &self.list, &self.stats, &self.payload]
            .iter()
            .any(|reader| reader.get_hash() == script.get_hash())
    }
}

#[cfg(test)]
mod tests {
    /// Each script's own file, as the header convention applies to it.
    const FILES: [(&str, &str); 16] = [
        ("schedule.lua", include_str!("scripts/schedule.lua")),
        ("time.lua", include_str!("scripts/time.lua")),
        ("claim.lua", include_str!("scripts/claim.lua")),
        ("finish.lua", include_str!("scripts/finish.lua")),
        ("extend.lua", include_str!("scripts/extend.lua")),
        ("release.lua", include_str!("scripts/release.lua")),
        ("change.lua", include_str!("scripts/change.lua")),
        (
            "schedule_recurring.lua",
            include_str!("scripts/schedule_recurring.lua"),
        ),
        ("advance.lua", include_str!("scripts/advance.lua")),
        ("list.lua", include_str!("scripts/list.lua")),
        ("purge.lua", include_str!("scripts/purge.lua")),
        ("get.lua", include_str!("scripts/get.lua")),
        ("stats.lua", include_str!("scripts/stats.lua")),
        ("payload.lua", include_str!("scripts/payload.lua")),
        ("kept_reply.lua", include_str!("scripts/kept_reply.lua")),
        ("pause.lua", include_str!("scripts/pause.lua")),
    ];

    #[test]
    fn every_script_states_its_contract_in_its_header() {
        for (file, text) in FILES {
            let header: Vec<&str> = text.lines().take_while(|l| l.starts_with("--")).collect();
            assert!(header[0].starts_with(&format!("-- {file} — ")), "{file}");
            for part in ["KEYS[1]", "ARGV[1]", "Reply:", "Invariants:"] {
                assert!(
                    header.iter().any(|line| line.contains(part)),
                    "the header of {file} does not state {part}"
                );
            }
        }
    }

    /// The literal indices of `name[…]` in `text`, e.g. 1 and 3 for `KEYS[1] … KEYS[3]`.
    fn indices(text: &str, name: &str) -> std::collections::BTreeSet<usize> {
        text.split(&format!("{name}["))
            .skip(1)
            .filter_map(|rest| rest.split(']').next()?.parse().ok())
            .collect()
    }

    #[test]
    fn every_header_names_the_keys_and_arguments_its_script_uses() {
        for (file, text) in FILES {
            let split = text.find("\n\n").expect("a blank line ends the header");
            let (header, body) = text.split_at(split);
            // A key only there to route the call to its partition's node says so.
            let read: String = header
                .lines()
                .filter(|line| !line.contains("not read"))
                .collect();
            assert_eq!(indices(&read, "KEYS"), indices(body, "KEYS"), "{file}");
            assert!(
                indices(body, "ARGV").is_subset(&indices(header, "ARGV")),
                "{file}"
            );
        }
    }
}

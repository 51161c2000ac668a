//! The agent inside every sandbox: commands that end with their own
//! process, leftovers that stay recorded and killable, runaways of finished
//! commands ended so new commands start, why a command ended, output not
//! lost to a reader who keeps reading, any image, and a sandbox whose agent
//! is killed or stopped.

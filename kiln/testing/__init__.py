"""Testing tools that ship with kiln: fuzzers and the sandbox they run cases in."""

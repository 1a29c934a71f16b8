# Reads cargo test output; prints, for every failed test, its binary, its name, where it panicked
# and the first lines of the message, each cut at 300 characters: at most 6 message lines a test
# and 16 lines in all, so that even a short CI tail holds the reason.
function out(text) {
  if (printed < 16) print substr(text, 1, 300)
  printed++
}
/^ *Running / { binary = $0; sub(/^ *Running /, "", binary); sub(/ \(.*$/, "", binary) }
/^---- .* stdout ----$/ { test = $2; in_panic = 0; next }
test != "" && /^thread '[^']*'( \([0-9]+\))? panicked at / {
  where = $0; sub(/^thread '[^']*'( \([0-9]+\))? panicked at /, "", where)
  out("FAILED " test " (" binary ") at " where)
  in_panic = 1; lines = 0; next
}
in_panic && /^(note: run with `RUST_BACKTRACE|[Ss]tack backtrace:)/ { in_panic = 0; next }
in_panic { if (lines < 6) out("  " $0); lines++; next }
/^failures:$/ { test = "" }
END { if (printed > 16) print "(" printed - 16 " more lines in the whole output)" }

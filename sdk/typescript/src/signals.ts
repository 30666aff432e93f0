// Signals by name or number: the standard Linux ones (1-31), as the API accepts them.

const NAMES = [
  "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE", "ALRM", "TERM",
  "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO",
  "PWR", "SYS",
] as const;

/** `9`, `"KILL"` or `"SIGKILL"`. */
export type Signal = number | `SIG${(typeof NAMES)[number]}` | (typeof NAMES)[number];

/** The number of `signal`; a `RangeError` for what no process can be sent. */
export function signalNumber(signal: Signal): number {
  if (typeof signal === "number") {
    if (Number.isInteger(signal) && signal >= 1 && signal <= NAMES.length) return signal;
    throw new RangeError(`signal ${signal} is not a Linux signal a process can be sent: use 1-31 or a name like "SIGTERM"`);
  }
  const index = NAMES.indexOf(signal.toUpperCase().replace(/^SIG/, "") as (typeof NAMES)[number]);
  if (index < 0) throw new RangeError(`unknown signal ${JSON.stringify(signal)}; use a name like "SIGTERM" or a number`);
  return index + 1;
}

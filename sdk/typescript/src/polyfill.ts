// `await using` needs `Symbol.asyncDispose`; Node has it from 18.18 and 20.4, this covers
// runtimes without it (the same well-known symbol TypeScript's helpers look up).
const symbols = Symbol as unknown as { asyncDispose?: symbol; dispose?: symbol };
symbols.asyncDispose ??= Symbol.for("Symbol.asyncDispose");
symbols.dispose ??= Symbol.for("Symbol.dispose");
export {};

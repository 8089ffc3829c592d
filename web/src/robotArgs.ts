/** `NAME=VALUE NAME=VALUE` (as `rlark robot start --arg NAME=VALUE` repeated) as an object;
 * an error names the first word that is not `NAME=VALUE`. */
export function parseArgs(text: string): { args: Record<string, string> } | { error: string } {
  const args: Record<string, string> = {};
  for (const word of text.split(/\s+/).filter(Boolean)) {
    const at = word.indexOf('=');
    if (at <= 0) return { error: `launch argument ${JSON.stringify(word)} must be NAME=VALUE` };
    args[word.slice(0, at)] = word.slice(at + 1);
  }
  return { args };
}

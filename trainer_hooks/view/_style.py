"""The report's stylesheet: inlined, system fonts only, light and dark."""

CSS = """
:root {
  --bg: #f5f6f8; --card: #ffffff; --ink: #1d2330; --muted: #667085; --line: #e4e7ec;
  --accent: #3559e0; --code: #f2f4f7; --shadow: 0 1px 2px rgba(16, 24, 40, .06), 0 1px 3px rgba(16, 24, 40, .08);
  --ok: #067647; --ok-bg: #ecfdf3; --warn: #b54708; --warn-bg: #fffaeb; --bad: #b42318; --bad-bg: #fef3f2;
  --info: #175cd3; --info-bg: #eff8ff; --gray: #475467; --gray-bg: #f2f4f7;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0f1218; --card: #171b24; --ink: #e6e9ef; --muted: #98a2b3; --line: #2a3040;
    --accent: #7b9cff; --code: #11151d; --shadow: none;
    --ok: #47cd89; --ok-bg: #0b2a1c; --warn: #fdb022; --warn-bg: #2e2108; --bad: #f97066; --bad-bg: #3a1512;
    --info: #84caff; --info-bg: #0b2440; --gray: #b0b8c5; --gray-bg: #222836;
  }
}
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; }
body {
  margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
}
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.wrap { max-width: 1200px; margin: 0 auto; padding: 24px 24px 64px; }
header.top { margin-bottom: 20px; }
.eyebrow { color: var(--muted); font-size: 12px; letter-spacing: .06em; text-transform: uppercase; font-weight: 600; }
h1 { font-size: 24px; margin: 2px 0 2px; font-weight: 650; word-break: break-all; }
h2 { font-size: 16px; margin: 0; font-weight: 650; }
h3 { font-size: 12px; margin: 14px 0 6px; color: var(--muted); text-transform: uppercase; letter-spacing: .05em; }
.path { color: var(--muted); font-size: 12px; word-break: break-all; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 12px; box-shadow: var(--shadow); }
.stats { display: grid; grid-template-columns: repeat(auto-fill, minmax(128px, 1fr)); gap: 12px; margin: 16px 0; }
.stat { padding: 12px 14px; }
.stat .v { font-size: 20px; font-weight: 650; font-variant-numeric: tabular-nums; }
.stat .k { color: var(--muted); font-size: 12px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; padding: 14px 16px; margin: 0; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; word-break: break-word; }
.section { padding: 16px; margin: 16px 0; }
table.index { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.index th, table.index td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
table.index th { color: var(--muted); font-weight: 600; font-size: 12px; }
table.index td.num, table.index th.num { text-align: right; }
table.index tr:last-child td { border-bottom: 0; }
table.index tbody tr:hover { background: var(--gray-bg); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 12px; font-weight: 600;
  background: var(--gray-bg); color: var(--gray); }
.badge.ok { background: var(--ok-bg); color: var(--ok); }
.badge.warn { background: var(--warn-bg); color: var(--warn); }
.badge.bad { background: var(--bad-bg); color: var(--bad); }
.badge.info { background: var(--info-bg); color: var(--info); }
.sample { padding: 0; margin: 18px 0; overflow: hidden; scroll-margin-top: 12px; }
.sample-head { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 16px; padding: 12px 16px;
  border-bottom: 1px solid var(--line); }
.sample-head .pos { font-size: 18px; font-weight: 700; }
.kv { color: var(--muted); }
.kv b { color: var(--ink); font-weight: 600; font-variant-numeric: tabular-nums; }
.sample-body { padding: 4px 16px 16px; }
pre.text { margin: 0; padding: 10px 12px; background: var(--code); border: 1px solid var(--line); border-radius: 8px;
  white-space: pre-wrap; word-break: break-word; font-size: 12.5px; max-height: 320px; overflow: auto; }
.turns { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 12px; list-style: none;
  padding: 0; margin: 0; }
.turn { border: 1px solid var(--line); border-radius: 10px; overflow: hidden; background: var(--card); }
.turn .shot { display: block; background: var(--code); line-height: 0; }
.turn svg.thumb { display: block; width: 100%; height: auto; }
svg.defs { position: absolute; width: 0; height: 0; overflow: hidden; }
.turn .cap { padding: 8px 10px; font-size: 12.5px; }
.turn .cap .t { font-weight: 650; }
.turn .cap .action { display: block; margin-top: 2px; }
.turn .noimg { padding: 36px 10px; text-align: center; color: var(--bad); font-size: 12px; line-height: 1.4; }
.msg { margin: 8px 0; }
.msg .role { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); }
.problems { list-style: none; margin: 10px 0 0; padding: 0; }
.problems li { padding: 6px 10px; border-radius: 8px; margin: 4px 0; background: var(--bad-bg); color: var(--bad); }
.problems li.warning { background: var(--warn-bg); color: var(--warn); }
.problems .kind { font-weight: 700; margin-right: 6px; }
.grid2 { display: grid; grid-template-columns: repeat(auto-fit, minmax(320px, 1fr)); gap: 12px; }
details { margin-top: 12px; }
details summary { cursor: pointer; color: var(--muted); font-size: 12.5px; }
.muted { color: var(--muted); }
.chips { display: flex; flex-wrap: wrap; gap: 4px 6px; }
.chip { display: inline-block; padding: 0 8px; border: 1px solid var(--line); border-radius: 6px; background: var(--code);
  font-size: 12.5px; word-break: break-all; }
.chip .k { color: var(--muted); margin-right: 4px; }
.sub { display: block; color: var(--muted); font-size: 11.5px; }
.mismatch { color: var(--bad); font-weight: 600; }
footer { color: var(--muted); font-size: 12px; text-align: center; margin-top: 32px; }
"""

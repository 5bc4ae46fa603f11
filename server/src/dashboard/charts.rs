//! Server-rendered SVG charts for the dashboard pages.
//!
//! The dashboard's CSP forbids inline styles and scripts, so a chart is plain inline SVG: geometry in
//! attributes, colours from classes in `dashboard.css` (`.series-*`, `.meter-*`). Each chart is a
//! `<figure class="chart">`: a visible caption, an `<svg role="img">` named by its `<title>` and `<desc>`, and
//! the same numbers as a `<table class="chart-data">` inside a closed `<details>` ("Numbers"), so long tables do
//! not crowd the page yet are one click (or keystroke) away. The SVG has a `viewBox` and no pixel size: it
//! scales to its container. Output is deterministic (same input, same bytes).

use maud::{Markup, html};

/// The width of every chart in SVG units; text is sized in the same units, so it scales with the chart.
const W: f64 = 480.0;
/// The height of a column chart.
const COLUMNS_H: f64 = 200.0;
/// An estimate of the advance of one character of 11-unit axis text.
const CHAR_W: f64 = 6.6;
const PAD: f64 = 4.0;

/// One stack of values in a column chart; `class` is the suffix of its CSS class (`series-{class}`).
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub class: String,
    /// One value per category; missing values count as zero.
    pub values: Vec<u64>,
}

/// How a meter's value stands; shown in words too, not by colour alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeterState {
    Ok,
    Warn,
    Danger,
}

impl MeterState {
    /// The word for the state with the meter's words for a warning and a danger.
    pub fn label(self, words: [&'static str; 2]) -> &'static str {
        match self {
            MeterState::Ok => "ok",
            MeterState::Warn => words[0],
            MeterState::Danger => words[1],
        }
    }

    fn class(self) -> &'static str {
        ["meter-fill meter-ok", "meter-fill meter-warn", "meter-fill meter-danger"][self as usize]
    }
}

/// A horizontal meter: `value` of `max`, with `display` (e.g. "42 %" or "1,204 of 1,500") as its text.
#[derive(Clone, Debug)]
pub struct Meter {
    pub label: String,
    pub value: f64,
    pub max: f64,
    pub display: String,
    pub state: MeterState,
    /// What a warning and a danger are called for this measure, shown beside the value.
    pub words: [&'static str; 2],
}

/// The words of a usage meter's states.
pub const LIMIT_WORDS: [&str; 2] = ["near the limit", "at the limit"];

impl Meter {
    /// Usage against a limit: "1,204 of 1,500", a warning from 80 % and danger at the limit (a zero limit too).
    pub fn usage(label: &str, used: u64, limit: u64) -> Meter {
        let state = match (used, limit) {
            (u, l) if u >= l => MeterState::Danger,
            (u, l) if u.saturating_mul(5) >= l.saturating_mul(4) => MeterState::Warn,
            _ => MeterState::Ok,
        };
        let display = format!("{} of {}", thousands(used), thousands(limit));
        Meter { label: label.to_string(), value: used as f64, max: limit as f64, display, state, words: LIMIT_WORDS }
    }
}

/// `1204` → "1,204".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A ratio as a percentage: `0.42` → "42 %", one decimal below 1 % ("0.4 %"), "<0.1 %" for a sliver.
/// The space is a no-break space.
pub fn percent(ratio: f64) -> String {
    let p = if ratio.is_finite() { (ratio * 100.0).max(0.0) } else { 0.0 };
    match p {
        p if p > 0.0 && p < 0.05 => "<0.1\u{a0}%".to_string(),
        p if p > 0.0 && p < 0.95 => format!("{p:.1}\u{a0}%"),
        p => format!("{p:.0}\u{a0}%"),
    }
}

/// Vertical stacked columns, one per category (x labels thinned so they do not overlap), a y-axis maximum, a
/// legend, and a table with a row per category and a total column.
pub fn stacked_columns(id: &str, title: &str, description: &str, categories: &[String], series: &[Series]) -> Markup {
    columns(id, title, description, categories, series, true)
}

/// Like [`stacked_columns`] but the series stand side by side (values that do not add up: p50 and max).
pub fn grouped_columns(id: &str, title: &str, description: &str, categories: &[String], series: &[Series]) -> Markup {
    columns(id, title, description, categories, series, false)
}

fn columns(id: &str, title: &str, desc: &str, categories: &[String], series: &[Series], stacked: bool) -> Markup {
    debug_assert!(series.iter().all(|s| is_token(&s.class)), "series classes are CSS name tokens");
    let value = |s: &Series, i: usize| s.values.get(i).copied().unwrap_or(0);
    let totals: Vec<u64> = (0..categories.len()).map(|i| series.iter().map(|s| value(s, i)).sum()).collect();
    let max = match stacked {
        true => totals.iter().copied().max().unwrap_or(0),
        false => (0..categories.len()).flat_map(|i| series.iter().map(move |s| value(s, i))).max().unwrap_or(0),
    };
    let max_label = thousands(max);
    let (top, bottom) = (12.0, 22.0);
    let left = (max_label.len() as f64 * CHAR_W + 2.0 * PAD).max(24.0);
    let (plot_w, plot_h) = (W - left - PAD, COLUMNS_H - top - bottom);
    let base = top + plot_h;
    let slot = plot_w / categories.len().max(1) as f64;
    let step = label_step(categories, slot);
    let scale = if max == 0 { 0.0 } else { plot_h / max as f64 };
    let bar_w = (slot * 0.7).min(40.0);
    let total_column = stacked && series.len() > 1;
    // (category, series, x, y, width, height) of each drawn bar, left to right, bottom to top.
    let mut bars = Vec::new();
    for i in 0..categories.len() {
        let (x, mut y, w) = (left + i as f64 * slot + (slot - bar_w) / 2.0, base, bar_w / series.len().max(1) as f64);
        for (j, s) in series.iter().enumerate().filter(|(_, s)| value(s, i) > 0) {
            let h = value(s, i) as f64 * scale;
            y = if stacked { y - h } else { base - h };
            let (x, w) = if stacked { (x, bar_w) } else { (x + j as f64 * w, w) };
            bars.push((i, s, x, y, w, h));
        }
    }
    let svg = html! {
        line.gridline x1=(n(left)) y1=(n(top)) x2=(n(W - PAD)) y2=(n(top)) {}
        text.axis x=(n(left - PAD)) y=(n(top + 4.0)) text-anchor="end" { (max_label) }
        text.axis x=(n(left - PAD)) y=(n(base + 4.0)) text-anchor="end" { "0" }
        @for (i, s, x, y, w, h) in bars {
            rect class=(format!("bar series-{}", s.class)) x=(n(x)) y=(n(y)) width=(n(w)) height=(n(h)) {
                title { (categories[i]) " · " (s.name) ": " (thousands(value(s, i))) }
            }
        }
        @for (i, category) in categories.iter().enumerate() {
            @if i.is_multiple_of(step) {
                text.axis x=(n(left + (i as f64 + 0.5) * slot)) y=(n(COLUMNS_H - 6.0)) text-anchor="middle" { (category) }
            }
        }
        line.axis x1=(n(left)) y1=(n(top)) x2=(n(left)) y2=(n(base)) {}
        line.axis x1=(n(left)) y1=(n(base)) x2=(n(W - PAD)) y2=(n(base)) {}
        @if max == 0 { (no_data(left + plot_w / 2.0, top + plot_h / 2.0)) }
    };
    let table = html! {
        thead { tr {
            th scope="col" { "Period" }
            @for s in series { th.num scope="col" { (s.name) } }
            @if total_column { th.num scope="col" { "Total" } }
        } }
        tbody {
            @for (i, category) in categories.iter().enumerate() { tr {
                th scope="row" { (category) }
                @for s in series { td.num { (thousands(value(s, i))) } }
                @if total_column { td.num { (thousands(totals[i])) } }
            } }
            @if categories.is_empty() { (empty_row(series.len() + 1 + usize::from(total_column))) }
        }
    };
    let legend = html! {
        ul.chart-legend {
            @for s in series { li { span class=(format!("swatch series-{}", s.class)) aria-hidden="true" {} (s.name) } }
        }
    };
    figure(id, "chart chart-columns", title, desc, COLUMNS_H, svg, legend, table)
}

/// Labelled horizontal bars in the order given (pass them longest first), each value printed at its end.
pub fn horizontal_bars(id: &str, title: &str, description: &str, rows: &[(String, u64)]) -> Markup {
    const ROW_H: f64 = 34.0;
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let reserve = thousands(max).len() as f64 * CHAR_W + 2.0 * PAD;
    let full = W - 2.0 * PAD - reserve;
    let scale = if max == 0 { 0.0 } else { full / max as f64 };
    let height = 2.0 * PAD + ROW_H * rows.len().max(2) as f64;
    let svg = html! {
        @for (i, (label, value)) in rows.iter().enumerate() {
            @let y = PAD + i as f64 * ROW_H;
            @let w = *value as f64 * scale;
            text.label x=(n(PAD)) y=(n(y + 12.0)) { (truncate(label, ((W - 2.0 * PAD) / CHAR_W) as usize)) }
            @if *value > 0 { rect.bar x=(n(PAD)) y=(n(y + 17.0)) width=(n(w)) height="12" {} }
            text.value x=(n(PAD + w + PAD)) y=(n(y + 27.0)) { (thousands(*value)) }
        }
        line.axis x1=(n(PAD)) y1=(n(PAD)) x2=(n(PAD)) y2=(n(height - PAD)) {}
        @if max == 0 { (no_data(W / 2.0, height / 2.0)) }
    };
    let table = html! {
        thead { tr { th scope="col" { "Name" } th.num scope="col" { "Count" } } }
        tbody {
            @for (label, value) in rows { tr { th scope="row" { (label) } td.num { (thousands(*value)) } } }
            @if rows.is_empty() { (empty_row(2)) }
        }
    };
    figure(id, "chart chart-bars", title, description, height, svg, html! {}, table)
}

/// A compact list of horizontal meters, each with its label, its display text and its state in words.
pub fn meters(id: &str, title: &str, description: &str, meters: &[Meter]) -> Markup {
    const ROW_H: f64 = 32.0;
    let height = 2.0 * PAD + ROW_H * meters.len().max(2) as f64;
    let full = W - 2.0 * PAD;
    let svg = html! {
        @for (i, m) in meters.iter().enumerate() {
            @let y = PAD + i as f64 * ROW_H;
            @let text = match m.state { MeterState::Ok => m.display.clone(), s => format!("{} ({})", m.display, s.label(m.words)) };
            @let room = ((full - text.chars().count() as f64 * CHAR_W) / CHAR_W - 2.0).max(8.0) as usize;
            @let ratio = if m.max > 0.0 && m.value.is_finite() { (m.value / m.max).clamp(0.0, 1.0) } else { 0.0 };
            text.label x=(n(PAD)) y=(n(y + 12.0)) { (truncate(&m.label, room)) }
            text.value x=(n(W - PAD)) y=(n(y + 12.0)) text-anchor="end" { (text) }
            rect.meter-track x=(n(PAD)) y=(n(y + 17.0)) width=(n(full)) height="10" rx="2" {}
            @if ratio > 0.0 { rect class=(m.state.class()) x=(n(PAD)) y=(n(y + 17.0)) width=(n(full * ratio)) height="10" rx="2" {} }
        }
        @if meters.is_empty() {
            line.axis x1=(n(PAD)) y1=(n(PAD)) x2=(n(PAD)) y2=(n(height - PAD)) {}
            (no_data(W / 2.0, height / 2.0))
        }
    };
    let table = html! {
        thead { tr { th scope="col" { "Measure" } th.num scope="col" { "Value" } th scope="col" { "State" } } }
        tbody {
            @for m in meters { tr { th scope="row" { (m.label) } td.num { (m.display) } td { (m.state.label(m.words)) } } }
            @if meters.is_empty() { (empty_row(3)) }
        }
    };
    figure(id, "chart chart-meters", title, description, height, svg, html! {}, table)
}

#[allow(clippy::too_many_arguments)]
fn figure(
    id: &str,
    class: &str,
    title: &str,
    desc: &str,
    h: f64,
    svg: Markup,
    legend: Markup,
    table: Markup,
) -> Markup {
    debug_assert!(is_token(id), "chart ids are name tokens: {id:?}");
    html! {
        figure class=(class) id=(id) {
            figcaption { (title) }
            svg xmlns="http://www.w3.org/2000/svg" role="img" aria-labelledby=(format!("{id}-title {id}-desc"))
                viewBox=(format!("0 0 {} {}", n(W), n(h))) preserveAspectRatio="xMidYMid meet" width="100%" {
                title id=(format!("{id}-title")) { (title) }
                desc id=(format!("{id}-desc")) { (desc) }
                (svg)
            }
            (legend)
            details.chart-numbers {
                summary { "Numbers" }
                table.chart-data { caption { (title) } (table) }
            }
        }
    }
}

fn no_data(x: f64, y: f64) -> Markup {
    html! { text.empty x=(n(x)) y=(n(y)) text-anchor="middle" { "No data yet" } }
}

fn empty_row(columns: usize) -> Markup {
    html! { tr { td colspan=(columns) { "No data yet" } } }
}

/// Shows every `step`-th x label so the widest label fits its share of the axis.
fn label_step(labels: &[String], slot: f64) -> usize {
    let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as f64;
    ((widest * CHAR_W + 6.0) / slot.max(1.0)).ceil().max(1.0) as usize
}

fn truncate(text: &str, max: usize) -> String {
    match text.chars().count() > max {
        true => text.chars().take(max.saturating_sub(1)).chain(['…']).collect(),
        false => text.to_string(),
    }
}

/// A coordinate with at most one decimal ("12", "12.5"), never "-0".
fn n(v: f64) -> String {
    let s = format!("{:.1}", v + 0.0);
    match s.strip_suffix(".0") {
        Some("-0") => "0".to_string(),
        Some(whole) => whole.to_string(),
        None => s,
    }
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny XML check: tags balance, attributes are quoted, text holds no raw `<` or bare `&`.
    fn well_formed(doc: &str) -> Result<(), String> {
        let mut stack: Vec<&str> = Vec::new();
        let mut rest = doc;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open])?;
            let close = rest[open..].find('>').ok_or("unclosed tag")? + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                (stack.pop() == Some(name)).then_some(()).ok_or(format!("</{name}> closes nothing open"))?;
                continue;
            }
            let (name, mut attrs) = tag.split_once(' ').unwrap_or((tag, ""));
            while let Some((key, after)) = attrs.trim_start().split_once("=\"") {
                (!key.is_empty() && !key.contains([' ', '"'])).then_some(()).ok_or(format!("bad attribute {key:?}"))?;
                let end = after.find('"').ok_or("unquoted attribute")?;
                check_text(&after[..end])?;
                attrs = &after[end + 1..];
            }
            (attrs.trim().is_empty()).then_some(()).ok_or(format!("stray {attrs:?} in <{name}>"))?;
            stack.push(name);
        }
        check_text(rest)?;
        stack.is_empty().then_some(()).ok_or(format!("unclosed {stack:?}"))
    }

    fn check_text(text: &str) -> Result<(), String> {
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..text[i..].find(';').map_or(i, |e| i + e + 1)];
            ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].contains(&entity).then_some(()).ok_or("bare &")?;
        }
        Ok(())
    }

    /// The value of `name` in each `<rect>` whose class contains `class`.
    fn rects(doc: &str, class: &str, name: &str) -> Vec<f64> {
        doc.split("<rect ")
            .skip(1)
            .filter(|r| r.split('>').next().is_some_and(|t| t.contains(class)))
            .map(|r| r.split(&format!(" {name}=\"")).nth(1).unwrap().split('"').next().unwrap().parse().unwrap())
            .collect()
    }

    fn days(k: usize) -> Vec<String> {
        (1..=k).map(|d| format!("{d} Nov")).collect()
    }

    fn series(name: &str, values: &[u64]) -> Series {
        Series { name: name.into(), class: name.into(), values: values.to_vec() }
    }

    #[test]
    fn the_checker_rejects_bad_markup() {
        for bad in ["<a><b></a></b>", "<rect x=1></rect>", "<p>a & b</p>", "<p>", "</p>", "<p a=\"1\" b></p>"] {
            assert!(well_formed(bad).is_err(), "{bad}");
        }
        well_formed("<svg a=\"&amp;\"><g></g>x &lt; y</svg>").unwrap();
    }

    #[test]
    fn numbers() {
        assert_eq!([0, 999, 1_204, 1_000_000].map(thousands), ["0", "999", "1,204", "1,000,000"]);
        assert_eq!(
            [0.42, 0.004, 0.0001, 0.0, 1.0].map(percent),
            ["42\u{a0}%", "0.4\u{a0}%", "<0.1\u{a0}%", "0\u{a0}%", "100\u{a0}%"]
        );
        assert_eq!([12.04, -0.01, 3.25].map(n), ["12", "0", "3.2"]);
    }

    #[test]
    fn columns_are_well_formed_named_and_proportional() {
        let cats = days(3);
        let s = [series("sent", &[10, 40, 20]), series("refused", &[5, 20, 0])];
        let doc = stacked_columns("sends", "Sends a day", "Sends by decision.", &cats, &s).into_string();
        well_formed(&doc).unwrap();
        assert_eq!(doc, stacked_columns("sends", "Sends a day", "Sends by decision.", &cats, &s).into_string());
        assert!(doc.contains(r#"aria-labelledby="sends-title sends-desc""#));
        assert!(doc.contains(r#"<title id="sends-title">Sends a day</title>"#));
        assert!(doc.contains(r#"<desc id="sends-desc">Sends by decision.</desc>"#));
        assert!(doc.contains(r#"viewBox="0 0 480 200""#) && !doc.contains("style"));
        // The tallest stack (40 + 20) spans the plot: from its top (12) to the baseline (178).
        let (ys, hs) = (rects(&doc, "series-", "y"), rects(&doc, "series-", "height"));
        assert_eq!(ys.iter().copied().fold(f64::MAX, f64::min), 12.0);
        assert_eq!(hs, [27.7, 13.8, 110.7, 55.3, 55.3]);
        assert!(doc.contains(">60</text>"), "y-axis maximum");
        // The table: a row per category with the same numbers and the total.
        let rows: Vec<&str> = doc.split("<tbody>").nth(1).unwrap().split("<tr>").skip(1).collect();
        assert_eq!(rows.len(), 3);
        assert!(rows[1].contains(
            r#"<th scope="row">2 Nov</th><td class="num">40</td><td class="num">20</td><td class="num">60</td>"#
        ));
        assert!(doc.contains(r#"<span class="swatch series-refused" aria-hidden="true"></span>refused"#));
    }

    #[test]
    fn grouped_columns_stand_side_by_side() {
        let s = [series("p50", &[100, 300]), series("max", &[400, 1_200])];
        let doc = grouped_columns("lat", "Latency", "ms", &days(2), &s).into_string();
        well_formed(&doc).unwrap();
        assert_eq!(rects(&doc, "series-max", "height")[1], 166.0);
        assert!(!doc.contains("Total") && doc.contains(">1,200<"));
    }

    #[test]
    fn x_labels_are_thinned() {
        let s = [series("sent", &[1; 30])];
        let doc = stacked_columns("d", "t", "d", &days(30), &s).into_string();
        let shown = |doc: &str| doc.matches(r#"text-anchor="middle">"#).count();
        let step = label_step(&days(30), (W - 24.0 - PAD) / 30.0);
        assert!(step > 1);
        assert_eq!(shown(&doc), 30usize.div_ceil(step));
        assert!(doc.contains(">1 Nov</text>") && !doc.contains(">2 Nov</text>"));
        let doc = stacked_columns("d", "t", "d", &days(3), &s).into_string();
        assert_eq!(shown(&doc), 3);
    }

    #[test]
    fn empty_data_draws_axes_and_zeros() {
        let doc = stacked_columns("e", "t", "d", &days(2), &[series("sent", &[])]).into_string();
        well_formed(&doc).unwrap();
        assert!(doc.contains(">No data yet</text>") && doc.contains(r#"<line class="axis""#));
        assert!(rects(&doc, "series-", "height").is_empty());
        assert_eq!(doc.matches(r#"<td class="num">0</td>"#).count(), 2);
        for doc in [horizontal_bars("h", "t", "d", &[]), meters("m", "t", "d", &[])].map(Markup::into_string) {
            well_formed(&doc).unwrap();
            assert!(doc.contains(">No data yet</text>") && doc.contains(">No data yet</td>"));
        }
    }

    #[test]
    fn text_is_escaped() {
        let evil = "<script>alert(1)</script> & \"x\"".to_string();
        let rows = [(evil.clone(), 3)];
        let docs = [
            horizontal_bars("x", &evil, &evil, &rows),
            stacked_columns("x", "t", "d", std::slice::from_ref(&evil), &[series("sent", &[1])]),
            meters("x", "t", "d", &[Meter { label: evil.clone(), display: evil, ..Meter::usage("", 1, 2) }]),
        ];
        for doc in docs.map(Markup::into_string) {
            well_formed(&doc).unwrap();
            assert!(!doc.contains("<script") && doc.contains("&lt;script&gt;"));
        }
    }

    #[test]
    fn bars_and_meters() {
        let rows = [("quiet-hours".to_string(), 1_500), ("new-recipient".to_string(), 750)];
        let doc = horizontal_bars("r", "Refusals by rule", "Last 30 days.", &rows).into_string();
        well_formed(&doc).unwrap();
        let widths = rects(&doc, "bar", "width");
        assert_eq!(widths[0], widths[1] * 2.0);
        assert!(
            doc.contains(">1,500</text>")
                && doc.contains(r#"<th scope="row">new-recipient</th><td class="num">750</td>"#)
        );
        let m = [Meter::usage("Today", 1_204, 1_500), Meter::usage("Period", 1, 0), Meter::usage("Idle", 0, 10)];
        assert_eq!(m.each_ref().map(|m| m.state), [MeterState::Warn, MeterState::Danger, MeterState::Ok]);
        let doc = meters("u", "Usage", "Against limits.", &m).into_string();
        well_formed(&doc).unwrap();
        assert!(doc.contains("1,204 of 1,500 (near the limit)</text>") && doc.contains("<td>at the limit</td>"));
        assert_eq!(rects(&doc, "meter-fill", "width"), [378.9]);
    }
}

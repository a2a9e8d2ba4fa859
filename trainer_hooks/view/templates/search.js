"use strict";
const box = document.getElementById("q");
const count = document.getElementById("n");
const rows = Array.from(document.querySelectorAll("tbody tr"));
const texts = rows.map((r) => r.textContent.toLowerCase());
function search() {
  const words = box.value.toLowerCase().split(/\s+/).filter((w) => w.length > 0);
  let shown = 0;
  rows.forEach((r, i) => {
    const hit = words.every((w) => texts[i].includes(w));
    r.hidden = !hit;
    if (hit) shown += 1;
  });
  count.textContent = String(shown);
}
box.addEventListener("input", search);
search();

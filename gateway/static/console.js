// vmsched console: the little script it needs (served by the gateway, no inline script, no CDN).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // filter a table's rows by the text typed in its search box
  document.querySelectorAll("input.filter[data-table]").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    if (!table) { return; }
    input.addEventListener("input", function () {
      var needle = input.value.toLowerCase();
      table.querySelectorAll("tbody tr").forEach(function (row) {
        row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) === -1;
      });
    });
  });
  // times in the reader's own time zone (the server writes UTC)
  document.querySelectorAll("time[data-epoch]").forEach(function (el) {
    var at = new Date(parseFloat(el.getAttribute("data-epoch")) * 1000);
    if (!isNaN(at.getTime())) { el.title = el.textContent; el.textContent = at.toLocaleString(); }
  });
});

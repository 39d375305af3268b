"use strict";
(function () {
  const why = new URLSearchParams(location.search).get("failed");
  if (!why) return;
  const p = document.getElementById("failed");
  p.textContent = why === "unknown" ? "This daemon does not know that token (revoked, or for another cluster)."
    : "That is not a token: tokens look like pt_… (peloton token create).";
  p.hidden = false;
})();

// Sections 6-11 of the lesson: logits, sampling draw, loop and KV cache, stop, context window, experiments.
"use strict";

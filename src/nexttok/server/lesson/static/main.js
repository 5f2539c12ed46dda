// The explainer page's entry, loaded by index.html as an ES module (no build step: the browser
// follows the imports). The page in the pipeline's order:
//   app.js              the prompt box, Step and the dials, the step's table, stages, attention, tree
//   sections/*.js       the lesson, one module per section of the page (1 tokens … 11 experiments,
//                       4b the mixture of experts after 4 attention);
//                       each builds its part and follows the session through app.js's on()
//   api.js, dom.js, format.js, plot.js   what they share: the server's routes, elements, numbers, SVG plots

import * as app from "./app.js";
import * as attention from "./sections/attention.js";
import * as captures from "./sections/captures.js";
import * as context from "./sections/context.js";
import * as embeddings from "./sections/embeddings.js";
import * as experiments from "./sections/experiments.js";
import * as experts from "./sections/experts.js";
import * as layers from "./sections/layers.js";
import * as logits from "./sections/logits.js";
import * as loop from "./sections/loop.js";
import * as position from "./sections/position.js";
import * as quiz from "./sections/quiz.js";
import * as sampling from "./sections/sampling.js";
import * as speculative from "./sections/speculative.js";
import * as stop from "./sections/stop.js";
import * as tokens from "./sections/tokens.js";
import * as traces from "./sections/traces.js";

app.install();
captures.install();  // before sections 4 and 5: their views read the node it follows
// In the page's order; each section's listeners run in this order too (loop records a step before
// stop plots it).
for (const section of [tokens, embeddings, position, attention, experts, layers, logits, sampling, loop, stop, context,
                       experiments, traces, speculative, quiz]) {
  section.build();
}

"""Sampling temperature bounds, shared by the configuration's rules and the server's requests.

A decoded reply stays in the OpenAI API's range (0-2). A reply drawn among candidates (our
server's `candidates` extension) is a softmax over a few scores, which a hotter temperature only
flattens, so a training rollout may draw it hotter to reach the questions the model is wrongly
sure of.
"""

DECODED_MAX_TEMPERATURE = 2.0
CANDIDATES_MAX_TEMPERATURE = 100.0

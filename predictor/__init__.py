"""The continuation predictor: features, embedders, MLP, artifacts, Predictor, RPC and client.

Entry points (import the submodule; this package imports nothing heavy itself):
`predictor.features` (ConversationWindow, FeatureConfig), `predictor.embedders`
(load_embedder), `predictor.artifact` (save_artifact, load_artifact), `predictor.predictor`
(Predictor), `predictor.server` (create_app, behind `lpc serve`), `predictor.client`
(PredictorClient). It depends on no other package of this repository; see docs/predictor.md.
"""

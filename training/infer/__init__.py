"""Out-of-core inference for every vertex: a trained model applied layer by layer over the whole graph.

``run`` (:func:`training.infer.run.infer`, the whole job), ``blocks`` (chunks of vertices and their
neighbourhoods), ``tables`` (the stores each layer reads through and the files it writes), ``model``
(a checkpoint's model, checked against the dataset). ``moment infer`` is the command.
"""
